"""Worker supervision, mixed into the Gateway: launching a worker process (its run files,
secret and supervisor file; the Ray launcher when configured), polling every worker each 100 ms by
its :class:`~sequence_ai_server.gateway.worker_record.Role` (serving, build beside, side, retiring), switching a
ready build in, stopping idle workers and keeping ``min_workers``, and adopting the workers a
previous gateway on the same data dir left running."""
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
from typing import Any, Optional

import httpx

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.store import DeploymentRow
from sequence_ai_server.common.processes import AdoptedProcess, process_alive, process_cmdline, process_start, stop_process
from sequence_ai_server.launchers.base import WorkerLaunchSpec, declared_resources
from sequence_ai_server.gateway.worker_record import (DEFAULT_IDLE_TIMEOUT_S, JAMMED_GRACE_S, STOP_GRACE_S, Role, WorkerProc, _exit_reason,
                      _log_tail, _read_json, _ready_host, _terminate, _worker_url, worker_key)

log = logging.getLogger("sequence_ai_server.gateway")


class DataDirInUse(OSError):
    """Another live gateway supervises the workers of this data dir (raised when a gateway starts)."""


class WorkerSupervision:
    """Starts, polls, switches, stops and adopts worker processes. Gateway state it uses:
    ``store``, ``workers``, ``sessions``, ``_lock`` and the others set in ``Gateway.__init__``."""

    # -- surviving a gateway restart: what each worker needs recorded, and adopting it again
    # A local worker does not die with its gateway (worker.py --supervisor-file): robots keep acting
    # on it with the leases they hold. The ``workers`` table of state.db records every running
    # worker (pid + start time, ready file, secret files, version, role); a gateway started on the
    # same data dir adopts each one still running that is really that worker, stops any other
    # worker of this data dir, and keeps the ``sessions`` table's open sessions of adopted workers.
    def _write_supervisor(self, path: Path) -> None:
        """Name this gateway as the supervisor in a worker's supervisor file (atomic replace)."""
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(self._me))
        os.replace(tmp, path)

    @staticmethod
    def _worker_record(key: str, w: WorkerProc) -> dict:
        rec = {"key": key, "name": w.name, "role": w.role.value, "pid": w.proc.pid, "start": w.proc_start,
               "ready_file": str(w.ready_file), "log_path": str(w.log_path), "started_at": w.started_at,
               "startup_timeout_s": w.startup_timeout_s, "secret": w.secret,
               "secret_file": str(w.secret_file) if w.secret_file else None,
               "activity_file": str(w.activity_file) if w.activity_file else None,
               "supervisor_file": str(w.supervisor_file) if w.supervisor_file else None,
               "version": w.version, "file": w.file, "class_name": w.class_name, "file_sha": w.file_sha,
               "spec": w.spec, "port": w.port, "host": w.host, "epoch": w.epoch}
        if w.role is Role.RETIRING:
            rec.update(retired_at=w.retired_at, grace_s=w.grace_s)
        return rec

    def _save_workers(self) -> None:
        """Record the running workers (serving, building, side, retiring) in the ``workers`` table,
        when they changed. Ray workers are not recorded: they stop with their actors."""
        if not self.launcher.adopts:
            return
        with self._lock:
            records = [self._worker_record(k, w) for k, w in self.workers.items()]
            records += [self._worker_record(f"{w.name}.retiring.{w.proc.pid}", w) for w in self._retiring]
            blob = json.dumps(records, sort_keys=True, default=str)
            if blob == self._saved_workers:
                return
            self.store.put_worker_records(records)
            self._saved_workers = blob

    def _is_worker(self, url: str, name: str, pid: int) -> bool:
        """True when ``url``'s ``/ping`` answers as worker ``name`` with process id ``pid``."""
        for _ in range(3):
            try:
                r = httpx.get(f"{url}/ping", timeout=3.0, trust_env=False)
                body = r.json() if r.status_code == 200 else {}
                return body.get("name") == name and body.get("pid") == pid
            except (httpx.HTTPError, ValueError):
                time.sleep(0.2)
        return False

    def _stop_in_background(self, proc: Any, why: str) -> None:
        log.warning("stopping worker pid %d: %s", proc.pid, why)
        threading.Thread(target=stop_process, args=(proc,), kwargs={"grace_s": STOP_GRACE_S},
                         name=f"stop-{proc.pid}", daemon=True).start()

    def _adopt_one(self, rec: dict) -> Optional[WorkerProc]:
        """A WorkerProc over the recorded worker ``rec`` when it still runs and is that worker (same
        pid and start time, our ready file on its command line, and, once serving, ``/ping`` naming
        it with that pid); None otherwise (one that is ours but no longer wanted is stopped)."""
        pid, start = int(rec["pid"]), rec.get("start")
        if not process_alive(pid, start):
            return None
        argv = process_cmdline(pid)
        if "sequence_ai_server.worker" not in argv or rec.get("ready_file") not in argv:
            return None
        proc = AdoptedProcess(pid, start)
        url = None
        if rec["role"] == Role.SERVING.value:
            row = self.store.get(rec["name"])
            if row is None or row.worker_pid != pid or row.status not in ("starting", "ready"):
                self._stop_in_background(proc, f"{rec['name']} no longer runs it")
                return None
            if row.status == "ready" and row.worker_port:
                url = _worker_url(row)
        elif rec["role"] == Role.SIDE.value and rec.get("port"):
            url = f"http://{rec.get('host') or '127.0.0.1'}:{rec['port']}"
        if url is not None and not self._is_worker(url, rec["name"], pid):
            self._stop_in_background(proc, f"it does not answer as the worker of {rec['name']} at {url}")
            return None

        def path(k: str) -> Optional[Path]:
            return Path(rec[k]) if rec.get(k) else None
        ready = Path(rec["ready_file"])
        spec = WorkerLaunchSpec(
            name=rec["name"], role=rec["role"], version=int(rec.get("version") or 0), policy_file=rec.get("file") or "",
            class_name=rec.get("class_name"), cwd=str(Path(rec.get("file") or ".").parent), secret=rec.get("secret") or "",
            run_dir=ready.parent, run_key=ready.name[:-len(".ready.json")], weights_dir=self.data_dir / "weights" / rec["name"],
            log_path=Path(rec["log_path"]))
        w = WorkerProc(rec["name"], self.launcher.adopt(spec, pid, start), Path(rec["ready_file"]), Path(rec["log_path"]), float(rec["started_at"]),
                       startup_timeout_s=float(rec.get("startup_timeout_s") or 1800.0), secret=rec.get("secret") or "",
                       secret_file=path("secret_file"), activity_file=path("activity_file"),
                       version=int(rec.get("version") or 0), file=rec.get("file") or "", class_name=rec.get("class_name"),
                       file_sha=rec.get("file_sha"), spec=rec.get("spec"), port=rec.get("port"), host=rec.get("host"),
                       epoch=int(rec.get("epoch") or 0), proc_start=start, supervisor_file=path("supervisor_file"),
                       role=Role(rec["role"]))
        if w.supervisor_file is not None:
            self._write_supervisor(w.supervisor_file)
        log.info("adopted the running %s worker of %s v%d (pid %d)", rec["role"], w.name, w.version, pid)
        return w

    def _adopt_workers(self) -> None:
        """At start: adopt the recorded workers still running, settle the deployment rows and
        builds whose worker is gone, keep the open sessions of adopted workers, and stop any other
        worker process of this data dir (one the previous run started but had not recorded)."""
        kept: set[int] = set()
        records = self.store.worker_records() if self.launcher.adopts else []
        for rec in records:        # a gateway still running on this data dir keeps its workers
            sup = _read_json(Path(rec["supervisor_file"])) if rec.get("supervisor_file") else None
            with contextlib.suppress(KeyError, TypeError, ValueError):
                if sup and int(sup["pid"]) != os.getpid() and process_alive(int(sup["pid"]), sup.get("start")):
                    raise DataDirInUse(f"another gateway (pid {sup['pid']}) is running on {self.data_dir} "
                                       "and supervises its workers; stop it first, or use another --data-dir")
        for rec in records:
            try:
                w = self._adopt_one(rec)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("a worker record could not be read (%s); not adopted", exc)
                continue
            if w is None:
                continue
            kept.add(w.proc.pid)
            if w.role is Role.RETIRING:             # was draining after a version switch: let it finish
                w.stopping, w.retired_at = True, time.time()
                w.grace_s = float(rec.get("grace_s") or STOP_GRACE_S)
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
                self._retiring.append(w)
            else:
                self.workers[rec["key"]] = w
        for row in self.store.all():
            name = row.name
            if row.status in ("starting", "ready") and name not in self.workers:
                self.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
            build = row.build if row.build is not None else None
            if build and build.get("status") == "switching" and not any(w.name == name for w in self._retiring):
                self.store.update(name, build=({**build, "status": "ready"}))
            elif build and build.get("status") == "building" and worker_key(Role.BUILD, name) not in self.workers:
                msg = "the gateway restarted during the build and its worker was gone"
                self.store.update(name, build=({**build, "status": "failed", "phase": "failed", "error": msg}))
                self.store.update_version(name, build["version"], status="failed", error=msg)
        now = time.time()
        for sess in self.sessions.load():
            row = self.store.get(sess.model)
            if sess.side:
                alive = sess.side in self.workers
            else:
                alive = (row is not None and row.status == "ready" and row.epoch == sess.epoch
                         and sess.model in self.workers)
            if sess.expires_at < now or not alive:
                self.sessions.pop(sess.id, None)
        if self.launcher.adopts:
            self._stop_unrecorded(kept)
        self._save_workers()

    def _stop_unrecorded(self, kept: set[int]) -> None:
        """Stop worker processes of this data dir (ready file under ``<data_dir>/run``) not adopted."""
        run = str(self.data_dir / "run") + os.sep
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in kept or int(entry) == os.getpid():
                continue
            argv = process_cmdline(int(entry))
            if "sequence_ai_server.worker" not in argv or "--ready-file" not in argv:
                continue
            i = argv.index("--ready-file")
            if i + 1 < len(argv) and argv[i + 1].startswith(run) and process_alive(int(entry)):
                self._stop_in_background(AdoptedProcess(int(entry), process_start(int(entry))),
                                         "a worker of this data dir that no record names")

    def _launch_spec(self, name: str, role: Role, file: str, class_name: Optional[str], version: int,
                     source: Path) -> WorkerLaunchSpec:
        """The launch spec of ``name``'s worker in ``role``: run files per launch (a build never
        touches the serving worker's), a fresh secret, the per-deployment settings it reads."""
        env = {"SEQ_CAPTURE_DIR": str(self.data_dir / "capture" / name),     # kept episodes (capture.py)
               "SEQ_VOLUMES_DIR": str(self.data_dir / "volumes"),            # weights="vol://NAME@vN" (volumes.py)
               "SEQ_JSON_LOG": str(self.data_dir / "logs" / f"{name}.jsonl")}  # structured log (logs.py)
        if self.url:
            env["SEQ_GATEWAY_URL"] = self.url                                 # declared secrets are fetched from here
        try:
            resources = declared_resources(file)
        except (OSError, SyntaxError):
            resources = {}
        return WorkerLaunchSpec(
            name=name, role=role.value, version=version, policy_file=file, class_name=class_name,
            cwd=str(source.parent), secret=secrets.token_urlsafe(32), run_dir=self.data_dir / "run",
            run_key=f"{worker_key(role, name, version)}.{secrets.token_hex(3)}",
            weights_dir=self.data_dir / "weights" / name, log_path=self.data_dir / "logs" / f"{name}.log",
            env=env, resources=resources, image=self._image_of(file), adoptable=self.launcher.adopts)

    def _image_of(self, file: str) -> Optional[dict]:
        """The policy's ``image=`` spec dict (envs.py reads it without importing), or None.
        Raises ApiError for a declaration the gateway cannot read."""
        from sequence_ai_server.launchers.envs import image_from_source
        return image_from_source(file)

    def _check_image(self, file: str) -> None:
        """At deploy: refuse an ``image=`` the launcher cannot build (``ApiError`` naming the step
        and what to do) before any version is recorded."""
        image = self._image_of(file)
        if image:
            self.launcher.check_image(image)

    def build_log(self, name: str, offset: int = 0) -> dict:
        """``{"name", "text", "offset", "size"}``: ``name``'s image build output (envs.py) from
        byte ``offset`` (at most 1 MiB; ``offset`` is where to ask next; ``size`` the whole
        log's). not_found when neither the deployment nor a build log exists; invalid_request
        for a negative offset."""
        path = self.data_dir / "logs" / f"{name}.build.log"
        if not path.exists():
            self.require(name)
        if offset < 0:
            raise ApiError("invalid_request", f"offset must be >= 0, got {offset}", hint="start at 0")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(min(offset, size))
                chunk = f.read(1 << 20)
        except FileNotFoundError:
            size, chunk = 0, b""
        return {"name": name, "text": chunk.decode(errors="replace"), "offset": min(offset, size) + len(chunk),
                "size": size}

    def _launch(self, name: str, role: Role, file: str, class_name: Optional[str], version: int,
                source: Path) -> WorkerProc:
        """Start a worker for ``name`` in ``role`` through the launcher (under
        ``workers[worker_key(role, name, version)]``); no state row is touched. It runs ``file``
        with cwd (and an import path entry) at the original file's directory. Raises
        ``errors.ApiError`` when the launcher refuses the spec."""
        spec = self._launch_spec(name, role, file, class_name, version, source)
        if spec.adoptable:      # a local worker outlives a gateway crash; a restarted gateway adopts it
            self._write_supervisor(spec.supervisor_file)
        handle = open(spec.log_path, "ab", buffering=0)
        handle.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name} v{version} =====\n".encode())
        try:
            proc = self.launcher.start(spec, handle)
        except BaseException:
            handle.close()
            raise
        self.cold_starts += 1
        w = WorkerProc(name, proc, spec.ready_file, spec.log_path, time.time(), log_handle=handle, secret=spec.secret,
                       secret_file=spec.secret_file, activity_file=spec.activity_file, version=version, file=file,
                       class_name=class_name, supervisor_file=spec.supervisor_file if spec.adoptable else None,
                       proc_start=process_start(proc.pid) if spec.adoptable and proc.pid else None, role=role)
        self.workers[worker_key(role, name, version)] = w
        log.info("started worker for %s v%d (pid %d)", name, version, proc.pid)
        self._save_workers()
        return w

    def _spawn(self, name: str) -> None:
        row = self.store.get(name)
        kept = {v.version: v for v in self.store.versions(name)}
        source = Path(kept[row.version].source_file) if row.version in kept else Path(row.file)
        w = self._launch(name, Role.SERVING, row.file, row.class_name, row.version, source)
        self.store.update(name, status="starting", phase="spawning", worker_pid=w.proc.pid, worker_port=None,
                          secret=w.secret, epoch=row.epoch + 1, error=None, details=None,
                          started_at=w.started_at, ready_at=None)

    def _stop_process(self, name: str) -> None:
        w = self.workers.pop(name, None)
        if w is None:
            return
        w.stopping = True
        _terminate(w.proc)
        w.drain()                       # its last log lines
        if w.log_handle:
            w.log_handle.close()

    def stop_all(self) -> None:
        with self._lock:
            workers = list(self.workers.values()) + self._retiring
            self.workers.clear()
            self._retiring = []
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
        self._save_workers()

    # -- supervision (called every 100 ms)
    def poll(self) -> None:
        with self._lock:
            for w in [*self.workers.values(), *self._retiring]:
                w.drain()               # log chunks, phase / ready / exit reports from the launcher
            for key, w in list(self.workers.items()):
                if w.role is Role.BUILD:
                    self._poll_build(key, w)
                elif w.role is Role.SIDE:
                    self._poll_side(key, w)
                else:
                    self._poll_one(key, w)
            self._reap_retiring()
            self._reap_side()
            self._expire_sessions()
            self._idle_and_min_workers()
            self._save_workers()

    def _poll_build(self, key: str, w: WorkerProc) -> None:
        """A version building beside the serving one: swap it in once ready; a failed build only
        records why (the serving version is untouched)."""
        name = w.name
        row = self.store.get(name)
        build = (row.build if row else None) or {}
        ph = w.phase_report()
        if ph.get("spec"):
            w.spec = ph["spec"]
            if self.refuse_missing_card(key, w, w.spec):   # gpu= names no card here (operations.py)
                return
        code = w.proc.poll()
        now = time.time()
        if code is None:
            ready = w.ready_report()
            if ready is not None:
                self._take_over(key, w, row, build, ready, now)
            return
        failed_msg = None
        if code is not None and not w.stopping:
            failed_msg, details = w.load_failure(code, ph.get("phase"))
        elif code is None and w.startup_expired(now):
            failed_msg, details = w.abandon()
        if code is not None or failed_msg:
            self.workers.pop(key, None)
            if w.log_handle:
                w.log_handle.close()
        if failed_msg:
            self.store.update(name, build={**build, "status": "failed", "phase": "failed",
                                           "error": failed_msg, "details": details})
            self.store.update_version(name, w.version, status="failed", error=failed_msg)
            log.warning("%s v%d failed to build; v%s keeps serving: %s", name, w.version, row.version, failed_msg)
        elif code is None and ph.get("phase") and build.get("phase") != ph["phase"]:
            self.store.update(name, build={**build, "phase": ph["phase"]})

    def _take_over(self, key: str, w: WorkerProc, row: DeploymentRow, build: dict, ready: dict, now: float) -> None:
        """The build ``w`` is ready: it becomes the serving worker of ``row`` (a new epoch, the
        traffic split cleared), and the worker it replaces retires (its secret rotated, SIGTERM,
        drained in the background)."""
        name = w.name
        self.workers.pop(key, None)
        old = self.workers.pop(name, None)
        w.role = Role.SERVING
        self.workers[name] = w
        load_s = round(now - w.started_at, 3)
        spec = ready.get("spec") or w.spec
        self.store.update(name, version=w.version, file=w.file, class_name=w.class_name, file_sha=w.file_sha,
                          status="ready", phase="ready", worker_port=int(ready["port"]), worker_pid=w.proc.pid,
                          worker_host=_ready_host(ready),
                          secret=w.secret, epoch=row.epoch + 1, error=None, details=None,
                          load_s=load_s, started_at=w.started_at, ready_at=now, served=1,
                          spec=spec or row.spec,
                          build=({**build, "status": "switching", "phase": "ready", "load_s": load_s}))
        if row.version != w.version:
            self.store.update_version(name, row.version, status="retired")
        jam = self._health.get(name)
        if jam and jam.get("state") == "jammed":
            self._health[name] = {**jam, "state": "replaced", "replaced_at": now, "new_pid": w.proc.pid}
            log.warning("%s: the jammed worker (pid %s) is replaced by pid %d", name, jam.get("pid"), w.proc.pid)
        pol = row.traffic
        if pol["split"]:   # a new serving version takes every new session (pins stay)
            pol["split"] = {}
            self.store.update(name, traffic=pol)
            self.traffic.forget(name)
            log.info("%s v%d took over: its traffic split is cleared", name, w.version)
        self.store.update_version(name, w.version, status="ready", load_s=load_s, error=None)
        # the new worker serves from here on; the old one's tokens stop working at once
        # (its clients reconnect to the new version) and it drains and exits in the background
        if old is not None:
            old.stopping = True
            old.proc.set_secret(secrets.token_urlsafe(32))
            with contextlib.suppress(ProcessLookupError):
                old.proc.send_signal(signal.SIGTERM)
            old.role, old.retired_at = Role.RETIRING, time.time()
            if jam and jam.get("state") == "jammed":
                old.grace_s = JAMMED_GRACE_S     # its replica thread is stuck: do not wait long
            self._retiring.append(old)
        else:
            self.store.update(name, build=({**build, "status": "ready", "load_s": load_s}))
        log.info("%s v%d took over after %.2fs", name, w.version, load_s)

    def _reap_retiring(self) -> None:
        for old in list(self._retiring):
            if old.proc.poll() is None:
                if time.time() - old.retired_at < old.grace_s:
                    continue
                old.proc.kill()
                old.proc.wait()
            self._retiring.remove(old)
            if old.log_handle:
                old.log_handle.close()
            row = self.store.get(old.name)
            build = row.build if row else None
            if build and build.get("status") == "switching":
                self.store.update(old.name, build=({**build, "status": "ready"}))

    def _poll_one(self, name: str, w: WorkerProc) -> None:
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
                if self.refuse_missing_card(name, w, ph["spec"]):   # gpu= names no card here (operations.py)
                    return
                fields["spec"] = ph["spec"]
                w.startup_timeout_s = float(ph["spec"].get("timeouts", {}).get("startup", 1800.0))
            if fields:
                self.store.update(name, **fields)
        code = w.proc.poll()
        if row.status == "starting" and code is None:
            ready = w.ready_report()
            if ready:
                now = time.time()
                self.store.update(name, status="ready", phase="ready", worker_port=int(ready["port"]),
                                  worker_host=_ready_host(ready), ready_at=now, load_s=round(now - w.started_at, 3), served=1,
                                  spec=ready.get("spec") or row.spec)
                log.info("%s is ready on port %s after %.2fs", name, ready["port"], now - w.started_at)
                self.store.update_version(name, row.version, status="ready", load_s=round(now - w.started_at, 3))
            return
        if code is not None:
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
            else:
                msg = f"worker {_exit_reason(code)} while serving; the next connect starts a new one"
                self.store.update(name, status="failed", phase="exited", error=msg,
                                  details={"log_tail": _log_tail(w.log_path), "exit_code": code},
                                  worker_port=None, worker_pid=None)
                log.warning("%s: %s", name, msg)
                self.alert_crash(name, row.version, w.proc.pid, code, msg)   # webhooks (operations.py)
            return
        if row.status == "starting" and w.startup_expired(time.time()):
            self.workers.pop(name, None)
            msg, details = w.abandon()
            self.store.update(name, status="failed", phase="failed", error=msg, served=0, details=details,
                              worker_port=None, worker_pid=None)

    def _idle_and_min_workers(self) -> None:
        """Stop a ready worker after idle_timeout with no request (direct /act included, via its
        activity file, plus connect/renew here); keep min_workers running (restart a stopped-idle
        or crashed one)."""
        now = time.time()
        for row in self.store.all():
            name = row.name
            min_workers = self.warm_floor(row)      # min_workers, or a scheduled floor (operations.py)
            if row.status == "ready" and name in self.workers and min_workers < 1:
                idle_timeout = float(self._spec_value(row, "idle_timeout", DEFAULT_IDLE_TIMEOUT_S))
                last = max(row.ready_at or 0.0, self._activity.get(name, 0.0))
                last = max(last, self.workers[name].last_activity())
                if now - last > idle_timeout:
                    log.info("%s idle for %.0f s (idle_timeout %g s): stopping its worker", name, now - last, idle_timeout)
                    self._stop_process(name)
                    self._drop_sessions(name)
                    self.store.update(name, status="stopped", phase="idle", worker_port=None, worker_pid=None)
            elif min_workers >= 1 and name not in self.workers and not row.halted_at and (
                    row.phase in ("idle", "exited") or (row.status == "stopped" and row.phase != "stopped")):
                log.info("%s declares min_workers=%d: starting its worker", name, min_workers)
                self._spawn(name)
