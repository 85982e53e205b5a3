"""The local launcher: a worker is a subprocess of the gateway on this machine.

A local worker does not die with its gateway (it watches its supervisor file, worker.py
``--supervisor-file``), so a gateway restarted on the same data dir adopts it
(:meth:`LocalLauncher.adopt`). The worker reports through its run files (``<key>.ready.json``
and its ``.phase`` / ``.error`` siblings, written atomically by worker.py); this module alone
reads them and turns them into typed events (base.py).

A deployment with an ``image=`` first gets its Python environment (envs.py: built once per
image spec and shared); the build runs on a thread of the handle, its output goes to the
deployment's build log, and the worker starts with the environment's interpreter once it is
there (a failed build reads as ``Failed`` then ``Exited(1)``).

A worker on the gateway's own interpreter is forked from the gateway's fork server (forked.py,
started with the first such worker) unless its environment or ``SEQ_WORKER_FORK=0`` rules that
out; it is then started as a process of its own, as an image worker always is.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from sequence_ai_server.common.processes import AdoptedProcess, process_start
from sequence_ai_server.launchers.base import EventQueue, Exited, Failed, Phase, Placed, Ready, Started, WorkerLaunchSpec
from sequence_ai_server.launchers.forked import ForkServer, fork_enabled

__all__ = ["LocalLauncher", "LocalWorker", "write_secret", "FORK_RESTART_AFTER_S"]

#: A fork server that went (killed, out of memory) after serving this long (s) is replaced by a new
#: one at the next start; one that goes sooner is not (a crash loop), and later workers start as
#: processes of their own, their logs saying why.
FORK_RESTART_AFTER_S = 60.0


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` with mode 0600 (atomic replace)."""
    tmp = Path(f"{path}.tmp")
    fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(tmp, path)


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class LocalWorker:
    """A worker subprocess (or one adopted after a gateway restart) and its events, read from its
    run files on each ``events()`` call. ``proc`` is None while its image environment builds."""

    def __init__(self, spec: WorkerLaunchSpec, proc: Any = None):
        self.spec = spec
        self.proc = proc
        self.args = spec.policy_file
        self._queue = EventQueue()
        self._phase_mtime = 0.0
        self._ready_sent = False
        self._exit_sent = False
        self._cancelled = False
        self._build_code: Optional[int] = None
        self._lock = threading.Lock()

    # -- Popen surface
    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    @property
    def returncode(self) -> Optional[int]:
        if self.proc is not None:
            return self.proc.returncode
        return self._build_code

    def poll(self) -> Optional[int]:
        """None while the worker (or its environment build) runs, else its exit code."""
        return self.proc.poll() if self.proc is not None else self._build_code

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the worker to exit; ``subprocess.TimeoutExpired`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.proc is None and self._build_code is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        if self.proc is None:
            return self._build_code  # type: ignore[return-value]
        return self.proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def send_signal(self, sig: int) -> None:
        """Signal the worker; while its environment still builds, cancel the start instead."""
        with self._lock:
            if self.proc is None:
                self._cancelled = True
                if self._build_code is None:
                    self._build_code = -int(sig)
                return
        self.proc.send_signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.send_signal(signal.SIGKILL)

    # -- launch.WorkerHandle
    def set_secret(self, secret: str) -> None:
        """Write the new direct secret to the worker's secret file (it re-reads it on change)."""
        write_secret(self.spec.secret_file, secret)

    def last_activity(self) -> float:
        """The activity file's mtime (unix s), 0 when it was never touched."""
        try:
            return self.spec.activity_file.stat().st_mtime
        except OSError:
            return 0.0

    def events(self) -> list:
        """New events: the queued ones (placement, start, build failure), then what the run files
        say now (a changed phase, ready once, the exit with its error report once)."""
        ready_file = self.spec.ready_file
        phase_path = Path(str(ready_file) + ".phase")
        with contextlib.suppress(OSError):
            mtime = phase_path.stat().st_mtime
            if mtime and mtime != self._phase_mtime:
                self._phase_mtime = mtime
                report = _read_json(phase_path)
                if report:
                    self._queue.put(Phase(report))
        code = self.poll()
        if not self._ready_sent and code is None and self.proc is not None:
            ready = _read_json(ready_file) if ready_file.exists() else None
            if ready and ready.get("port"):
                self._ready_sent = True
                self._queue.put(Ready(str(ready.get("url") or f"http://127.0.0.1:{ready['port']}"), ready))
        if code is not None and not self._exit_sent:
            self._exit_sent = True
            self._queue.put(Exited(code, _read_json(Path(str(ready_file) + ".error"))))
        return self._queue.drain()

    # -- start (in the background when an environment must be built first)
    def _popen(self, python: Optional[str], log_handle: Any, extra_paths: tuple = (), image_env: Optional[dict] = None,
               forks: Optional[ForkServer] = None) -> None:
        """Start the worker: forked from ``forks`` when it can be (forked.py), else a process."""
        spec = self.spec
        with self._lock:
            if self._cancelled and self.proc is None and forks is not None:
                return                                  # stopped while the fork server started
        env = spec.environment(extra_paths=extra_paths)
        env.update(image_env or {})
        pinned = spec.card_environment()         # its cards (ops/cards.py), applied last: nothing overrides them
        env.update(pinned)
        if pinned:
            log_handle.write(f"cards: CUDA_VISIBLE_DEVICES={pinned['CUDA_VISIBLE_DEVICES']!r}\n".encode())
        proc: Any = None
        if forks is not None and python is None:
            proc = forks.spawn(spec.command(None), env, spec.cwd, log_handle)
        if proc is None:
            proc = subprocess.Popen(spec.command(python), stdout=log_handle, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=spec.cwd, start_new_session=True)
        with self._lock:
            self.proc = proc
            cancelled = self._cancelled
        if cancelled:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        self._queue.put(Started(proc.pid))

    def _popen_on_thread(self, python: Optional[str], log_handle: Any, *args: Any, **kwargs: Any) -> None:
        """``_popen`` on a launcher thread (after an image build, or while the fork server starts):
        an error making the process (a gone cwd, EAGAIN at a pids limit, ENOMEM), which the
        caller's thread would have raised, ends the start as exit code 1 with the error in the
        log, never as a start that runs on with pid 0."""
        try:
            self._popen(python, log_handle, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - whatever it was, no worker runs
            with contextlib.suppress(OSError, ValueError):
                log_handle.write(f"the worker did not start: {type(exc).__name__}: {exc}\n".encode())
            with self._lock:
                if self.proc is None and self._build_code is None:
                    self._build_code = 1

    def _build_then_start(self, build: Callable, log_handle: Any) -> None:
        self._queue.put(Phase({"phase": "building_image", "t": time.time()}))
        try:
            env = build()
        except Exception as exc:  # noqa: BLE001 - every build failure is the deployment's error
            detail = getattr(exc, "detail", None) or str(exc)
            self._queue.put(Failed(f"the image environment failed to build: {detail}",
                                   getattr(exc, "details", None)))
            with self._lock:
                if self._build_code is None:
                    self._build_code = 1
            return
        with self._lock:
            if self._cancelled:
                return
        log_handle.write(f"image environment: {env.python}\n".encode())
        self._popen_on_thread(env.python, log_handle, env.extra_paths, env.env)


class LocalLauncher:
    """Starts workers as subprocesses here; they outlive a gateway crash and are adopted by the
    next gateway on the data dir. ``envs``: the image environment builder (envs.py), used
    for a spec with an ``image``; None runs every worker on the gateway's interpreter."""

    adopts = True
    places_cards = False    # gpu= is checked against this machine's cards

    def __init__(self, envs: Any = None, fork: Optional[bool] = None):
        self.envs = envs
        self.fork = fork_enabled() if fork is None else fork
        self._forks: Optional[ForkServer] = None
        self._forks_lock = threading.Lock()     # the supervisor starts workers from several threads

    def _fork_server(self, spec: WorkerLaunchSpec) -> Optional[ForkServer]:
        """The fork server for the next start: started with the first one, and again when the last
        went after serving ``FORK_RESTART_AFTER_S`` (the workers it forked keep their handles on
        it: watched by pid and start time once it is gone, as adopted workers are)."""
        if not self.fork:
            return None
        with self._forks_lock:
            old = self._forks
            if old is None or (old.lost and old.failed is None and old.served_since is not None
                               and time.monotonic() - old.served_since >= FORK_RESTART_AFTER_S):
                self._forks = ForkServer(spec.run_dir / "forkserver.log")
            return self._forks

    def start(self, spec: WorkerLaunchSpec, log_handle: Any) -> LocalWorker:
        """Start ``spec``'s worker (see launch.Launcher.start); its old run files are removed
        first, its secret file is written, and (adoptable) its supervisor file names
        ``supervisor``. With an image, the build runs first on a thread; the handle's ``pid``
        is 0 until the worker starts."""
        ready = spec.ready_file
        for p in (ready, Path(str(ready) + ".phase"), Path(str(ready) + ".error"), spec.activity_file):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        write_secret(spec.secret_file, spec.secret)
        w = LocalWorker(spec)
        w._queue.put(Placed("local"))
        if spec.image and self.envs is not None:
            build = self.envs.prepare(spec.image, spec.name, spec.version)   # raises ApiError for a refused step
            threading.Thread(target=w._build_then_start, args=(build, log_handle), daemon=True,
                             name=f"image-{spec.name}").start()
        else:
            forks = self._fork_server(spec)
            if forks is None or forks.ready:
                w._popen(None, log_handle, forks=forks)
            else:        # the fork server's own start (its import) on a thread; pid 0 until then
                threading.Thread(target=w._popen_on_thread, args=(None, log_handle), kwargs={"forks": forks}, daemon=True,
                                 name=f"fork-{spec.name}").start()
        return w

    def check_image(self, image: dict) -> None:
        """Raise ``envs.ImageStepRefused`` for an image whose steps cannot be built here."""
        if self.envs is not None:
            self.envs.check(image)

    def adopt(self, spec: WorkerLaunchSpec, pid: int, start: Optional[int]) -> LocalWorker:
        """A handle on a worker a previous gateway started (pid + start time, see _proc)."""
        return LocalWorker(spec, AdoptedProcess(pid, start))

    @staticmethod
    def process_start(handle: LocalWorker) -> Optional[int]:
        """The worker's start time (its identity with the pid), None before it started."""
        return process_start(handle.pid) if handle.pid else None

    def close(self) -> None:
        """End the fork server, if one started (workers outlive the gateway on purpose)."""
        with self._forks_lock:
            forks = self._forks
        if forks is not None:
            forks.close()
