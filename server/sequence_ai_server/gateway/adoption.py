"""Surviving a gateway restart: what each worker needs recorded, and adopting it again.

A local worker does not die with its gateway (``worker --supervisor-file``): robots keep acting on
it with the leases they hold. The ``workers`` table of state.db records every running worker (pid
and start time, ready file, secret files, version, role); a gateway started on the same data dir
adopts each one still running that is really that worker (:meth:`Adoption.adopt_all`), settles
the rows and builds whose worker is gone, and stops any other worker of this data dir. Which open
sessions survive is the session service's business (``SessionService.load``)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import httpx

from sequence_ai_server.common.plain_http import client_options
from sequence_ai_server.common.processes import AdoptedProcess, process_alive, process_cmdline, process_start, stop_process
from sequence_ai_server.gateway.store import Store
from sequence_ai_server.gateway.worker_record import (STOP_GRACE_S, Role, WorkerRecord, _read_json, _worker_url,
                                                      worker_key)
from sequence_ai_server.launchers.base import WorkerLaunchSpec

__all__ = ["Adoption", "DataDirInUse", "write_supervisor", "worker_record"]

log = logging.getLogger("sequence_ai_server.gateway")


class DataDirInUse(OSError):
    """Another live gateway supervises the workers of this data dir (raised when a gateway starts)."""


def write_supervisor(path: Path, me: dict) -> None:
    """Name the gateway ``me`` (``{"pid", "start"}``) as the supervisor in a worker's supervisor
    file (atomic replace)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(me))
    os.replace(tmp, path)


def worker_record(key: str, w: WorkerRecord) -> dict:
    """The ``workers`` table record of worker ``w`` under ``key``."""
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


def stop_in_background(proc: Any, why: str) -> None:
    """SIGTERM ``proc`` (SIGKILL after the grace) on a thread of its own."""
    log.warning("stopping worker pid %d: %s", proc.pid, why)
    threading.Thread(target=stop_process, args=(proc,), kwargs={"grace_s": STOP_GRACE_S},
                     name=f"stop-{proc.pid}", daemon=True).start()


class Adoption:
    """Adopts the workers a previous gateway on ``data_dir`` left running. ``adopt(spec, pid,
    start)``: the launcher's handle over a running process; ``me``: this gateway's
    ``{"pid", "start"}``; ``clock``: unix s."""

    def __init__(self, store: Store, data_dir: Path, adopt: Callable[..., Any], me: dict,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.data_dir, self._adopt, self.me, self._clock = store, data_dir, adopt, me, clock

    @staticmethod
    def _is_worker(url: str, name: str, pid: int) -> bool:
        """True when ``url``'s ``/ping`` answers as worker ``name`` with process id ``pid``."""
        for _ in range(3):
            try:
                r = httpx.get(f"{url}/ping", timeout=3.0, **client_options(url))
                body = r.json() if r.status_code == 200 else {}
                return body.get("name") == name and body.get("pid") == pid
            except (httpx.HTTPError, ValueError):
                time.sleep(0.2)
        return False

    def adopt_one(self, rec: dict) -> Optional[WorkerRecord]:
        """A WorkerRecord over the recorded worker ``rec`` when it still runs and is that worker
        (same pid and start time, our ready file on its command line, and, once serving, ``/ping``
        naming it with that pid); None otherwise (one that is ours but no longer wanted is stopped)."""
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
                stop_in_background(proc, f"{rec['name']} no longer runs it")
                return None
            if row.status == "ready" and row.worker_port:
                url = _worker_url(row)
        elif rec["role"] in (Role.SIDE.value, Role.EXTRA.value) and rec.get("port"):
            url = f"http://{rec.get('host') or '127.0.0.1'}:{rec['port']}"
        if url is not None and not self._is_worker(url, rec["name"], pid):
            stop_in_background(proc, f"it does not answer as the worker of {rec['name']} at {url}")
            return None

        def path(k: str) -> Optional[Path]:
            return Path(rec[k]) if rec.get(k) else None
        ready = Path(rec["ready_file"])
        spec = WorkerLaunchSpec(
            name=rec["name"], role=rec["role"], version=int(rec.get("version") or 0), policy_file=rec.get("file") or "",
            class_name=rec.get("class_name"), cwd=str(Path(rec.get("file") or ".").parent), secret=rec.get("secret") or "",
            run_dir=ready.parent, run_key=ready.name[:-len(".ready.json")], weights_dir=self.data_dir / "weights" / rec["name"],
            log_path=Path(rec["log_path"]))
        w = WorkerRecord(rec["name"], self._adopt(spec, pid, start), Path(rec["ready_file"]), Path(rec["log_path"]),
                         float(rec["started_at"]), startup_timeout_s=float(rec.get("startup_timeout_s") or 1800.0),
                         secret=rec.get("secret") or "", secret_file=path("secret_file"), activity_file=path("activity_file"),
                         version=int(rec.get("version") or 0), file=rec.get("file") or "", class_name=rec.get("class_name"),
                         file_sha=rec.get("file_sha"), spec=rec.get("spec"), port=rec.get("port"), host=rec.get("host"),
                         epoch=int(rec.get("epoch") or 0), proc_start=start, supervisor_file=path("supervisor_file"),
                         role=Role(rec["role"]))
        if w.supervisor_file is not None:
            write_supervisor(w.supervisor_file, self.me)
        log.info("adopted the running %s worker of %s v%d (pid %d)", rec["role"], w.name, w.version, pid)
        return w

    def adopt_all(self, records: list[dict], stop_others: bool) -> tuple[dict[str, WorkerRecord], list[WorkerRecord]]:
        """At start: ``(workers by key, retiring)`` adopted from ``records``; the deployment rows
        and builds whose worker is gone are settled, and (``stop_others``) any other worker process
        of this data dir is stopped. Raises DataDirInUse when a live gateway supervises them."""
        for rec in records:        # a gateway still running on this data dir keeps its workers
            sup = _read_json(Path(rec["supervisor_file"])) if rec.get("supervisor_file") else None
            with contextlib.suppress(KeyError, TypeError, ValueError):
                if sup and int(sup["pid"]) != os.getpid() and process_alive(int(sup["pid"]), sup.get("start")):
                    raise DataDirInUse(f"another gateway (pid {sup['pid']}) is running on {self.data_dir} "
                                       "and supervises its workers; stop it first, or use another --data-dir")
        workers: dict[str, WorkerRecord] = {}
        retiring: list[WorkerRecord] = []
        for rec in records:
            try:
                w = self.adopt_one(rec)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("a worker record could not be read (%s); not adopted", exc)
                continue
            if w is None:
                continue
            if w.role is Role.RETIRING:             # was draining after a version switch: let it finish
                w.stopping, w.retired_at = True, self._clock()
                w.grace_s = float(rec.get("grace_s") or STOP_GRACE_S)
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
                retiring.append(w)
            else:
                workers[rec["key"]] = w
        self._settle_rows(workers, retiring)
        if stop_others:
            self._stop_unrecorded({w.proc.pid for w in [*workers.values(), *retiring]})
        return workers, retiring

    def _settle_rows(self, workers: dict[str, WorkerRecord], retiring: list[WorkerRecord]) -> None:
        """Rows whose worker is gone read stopped; a switch whose old worker is gone is done; a
        build whose worker is gone failed."""
        for row in self.store.all():
            name = row.name
            if row.status in ("starting", "ready") and name not in workers:
                self.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
            build = row.build
            if build and build.get("status") == "switching" and not any(w.name == name for w in retiring):
                self.store.update(name, build=({**build, "status": "ready"}))
            elif build and build.get("status") == "building" and worker_key(Role.BUILD, name) not in workers:
                msg = "the gateway restarted during the build and its worker was gone"
                self.store.update(name, build=({**build, "status": "failed", "phase": "failed", "error": msg}))
                self.store.update_version(name, build["version"], status="failed", error=msg)

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
                stop_in_background(AdoptedProcess(int(entry), process_start(int(entry))),
                                   "a worker of this data dir that no record names")
