"""Real servers on loopback for tests: a gateway process with a temp data dir, and a bare
worker process. No mocks; everything is torn down (workers included) when the test ends.

    gw = GatewayProcess.start(tmp_path)          # or the ``gateway`` fixture in conftest.py
    gw.url, gw.api_key, gw.data_dir
    gw.deploy(file, name=None, wait=True)        # -> deployment dict (status ready/failed)
    gw.connect(name, params=None)                # -> httpx.Response (200 body or 503 warming)
    gw.connect_ready(name)                       # -> connect body, waiting out warming
    gw.status(name); gw.stop(name); gw.log(name)
    gw.client                                    # httpx.Client with the API key set

    w = WorkerProcess.start(file, tmp_path)      # python -m sequence_ai_server.worker directly
    w.url, w.secret, w.act(body), w.stop()

    freeze(pid)                                  # SIGSTOP, back once every thread has stopped
"""
from __future__ import annotations

import base64
import io
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import httpx
from sequence_ai_server.common.processes import stop_process

from _wait import eventually

ROOT = Path(__file__).resolve().parent.parent
POLICIES = Path(__file__).resolve().parent / "policies"
ECHO_POLICY = str(POLICIES / "echo_policy.py")


def _env(extra: Optional[dict] = None) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "server")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float, log: Path) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before it was ready:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)
    raise TimeoutError(f"not ready after {timeout}s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    return stop_process(proc, grace_s=timeout)


def _thread_states(pid: int) -> dict:
    """``{tid: state letter}`` of each thread of ``pid`` (``/proc/PID/task/TID/stat``)."""
    states = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states[tid] = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:       # a thread that has just exited
            pass
    return states


def freeze(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped (state ``T``).

    ``kill()`` returns before the stop lands: the kernel wakes one thread of the process (the main
    one) to take the signal, and only once that thread runs are the others stopped; a thread that
    runs first goes on meanwhile. A worker's same-host door thread, woken by a request sent right
    after the kill, read it, ran it (the echo policy runs inline there) and answered it: 2-5 of
    80 tries idle, 8 of 80 on a loaded 2-core machine (0 of 80 on the websocket, which the main
    thread serves; 0 of 80 after this wait). A test that expects a frozen worker waits here."""
    os.kill(pid, signal.SIGSTOP)
    try:
        eventually(lambda: all(state == "T" for state in _thread_states(pid).values()), timeout, 0.001,
                   what=f"every thread of {pid} stopped", detail=lambda: repr(_thread_states(pid)))
    except BaseException:
        os.kill(pid, signal.SIGCONT)    # the caller's finally does not cover a stop that never landed
        raise


def send_json(handler: Any, status: int, payload: Any) -> None:
    """Answer an ``http.server`` request with ``payload`` as JSON (a stand-in server's reply)."""
    body = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def seq_cli(gw: Optional["GatewayProcess"], *args: Any, env: Optional[dict] = None, input: Optional[str] = None,
            cwd: Optional[Path] = None, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """``seq ARGS`` against ``gw``: the real typer app, run in this process (typer's CliRunner),
    with ``gw.env()``, ``COLUMNS=250`` and ``env`` in the environment, ``input`` on stdin and
    ``cwd`` as the working directory for the call. Returns what ``subprocess.run`` would:
    ``returncode``, ``stdout``, ``stderr``. Fails the test after ``timeout`` s, so a ``seq deploy``
    that never ends fails within its bound, not at pytest-timeout's 600 s: a SIGUSR1 to this
    thread (the main one: pytest-timeout holds SIGALRM) raises ``pytest.fail``'s exception, a
    BaseException, which no ``except Exception`` and no transport error mapping in the CLI, httpx
    or httpcore turns into an error line and an exit code.

    In-process because a ``python -c 'from seq.cli import main; main()'`` costs ~0.35 s of CPU in
    imports (typer, rich, httpx) and the suite made ~130 of them: ~45 CPU-s of a ~640 CPU-s run.
    What only a process shows (the console scripts, ``python -m seq``, exit codes through the
    interpreter, signals) stays with tests that start one (test_seq_cli_package, the e2e tests,
    ``seq serve`` everywhere). An exception the CLI lets through is raised here, where a process
    would have exited 1 with a traceback: no test accepts that either."""
    from typer.testing import CliRunner

    from seq.cli import app
    argv = [str(a) for a in args]
    environ = {**(gw.env() if gw is not None else {}), "COLUMNS": "250", **(env or {})}

    def expired(signum: int, frame: Any) -> None:
        import pytest
        pytest.fail(f"seq {' '.join(argv)} did not finish within {timeout:g} s", pytrace=False)

    before, previous = os.getcwd(), signal.signal(signal.SIGUSR1, expired)
    timer = threading.Timer(timeout, signal.pthread_kill, (threading.get_ident(), signal.SIGUSR1))
    timer.daemon = True
    if cwd is not None:
        os.chdir(cwd)
    timer.start()
    try:
        result = CliRunner().invoke(app, argv, input=input, env=environ, catch_exceptions=False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
        os.chdir(before)
    return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, result.stderr)


def png_b64(width: int = 64, height: int = 64, color=(0, 0, 0), fmt: str = "PNG") -> str:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def echo_observation(*, views: Optional[dict] = None, joint_positions=None, gripper=None,
                     instruction: str = "put the red cube on the green pad") -> dict:
    """A wire observation the echo policy accepts; override pieces to make it wrong."""
    views = {"exterior_1": png_b64()} if views is None else views
    return {
        "images": [{"view": v, "data": d, "timestamp_ms": 0} for v, d in views.items()],
        "proprioception": {"joint_positions": [0.0] * 7 if joint_positions is None else joint_positions,
                           "gripper": [0.5] if gripper is None else gripper},
        "instruction": instruction,
    }


class GatewayProcess:
    """``python -m sequence_ai_server.gateway --port 0`` with its own data dir."""

    def __init__(self, proc: subprocess.Popen, data_dir: Path, info: dict, log_path: Path):
        self.proc = proc
        self.data_dir = data_dir
        self.info = info
        self.url: str = info["url"]
        self.log_path = log_path
        self.api_key: str = Path(info["api_key_file"]).read_text().strip()
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=30.0)

    @classmethod
    def start(cls, tmp: Path, env: Optional[dict] = None, timeout: float = 30.0) -> "GatewayProcess":
        tmp = Path(tmp)
        data_dir = tmp / "seq-home"
        ready = tmp / "gateway.ready.json"
        log_path = tmp / "gateway.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "sequence_ai_server.gateway", "--port", "0",
                                     "--data-dir", str(data_dir), "--ready-file", str(ready)],
                                    stdout=log, stderr=subprocess.STDOUT, env=_env(env), cwd=str(tmp))
        info = _wait_file(ready, proc, timeout, log_path)
        return cls(proc, data_dir, info, log_path)

    # -- API
    def deploy(self, file: str, name: Optional[str] = None, wait: bool = True, timeout: float = 60.0,
               class_name: Optional[str] = None) -> dict:
        name = name or Path(file).stem.replace("_", "-")
        r = self.client.post("/v1/deployments", json={"name": name, "file": str(Path(file).resolve()),
                                                      "class_name": class_name})
        r.raise_for_status()
        d = r.json()
        if not wait:
            return d
        if (d.get("build") or {}).get("status") == "building":   # a new version builds beside the serving one
            return self.wait_build(name, timeout)
        return self.wait_until(name, ("ready", "failed"), timeout)

    def wait_build(self, name: str, timeout: float = 60.0) -> dict:
        """Wait until the version building beside the serving one took over (build.status ready)
        or failed; returns the deployment."""
        deadline = time.monotonic() + timeout
        while True:
            d = self.status(name)
            if (d.get("build") or {}).get("status") in ("ready", "failed"):
                return d
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} build still {d.get('build')} after {timeout}s")
            time.sleep(0.05)

    def status(self, name: str) -> dict:
        r = self.client.get(f"/v1/deployments/{name}")
        r.raise_for_status()
        return r.json()

    def wait_until(self, name: str, statuses=("ready", "failed"), timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            d = self.status(name)
            if d["status"] in statuses:
                return d
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} still {d['status']}/{d.get('phase')} after {timeout}s")
            time.sleep(0.05)

    def connect(self, name: str, params: Optional[dict] = None) -> httpx.Response:
        return self.client.post("/v1/connect", json={"model": name, "params": params or {}})

    def connect_ready(self, name: str, params: Optional[dict] = None, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            r = self.connect(name, params)
            if r.status_code == 200:
                return r.json()
            if r.status_code != 503 or not r.json().get("retryable") or time.monotonic() > deadline:
                raise AssertionError(f"connect {name}: {r.status_code} {r.text}")
            time.sleep(0.1)

    def stop(self, name: str) -> dict:
        r = self.client.delete(f"/v1/deployments/{name}")
        r.raise_for_status()
        return r.json()

    def log(self, name: str) -> str:
        p = self.data_dir / "logs" / f"{name}.log"
        return p.read_text() if p.exists() else ""

    def env(self) -> dict:
        """Environment for a client or the seq CLI pointed at this gateway."""
        return {"SEQUENCES_GATEWAY_URL": self.url, "SEQUENCES_API_KEY": self.api_key, "SEQUENCES_HOME": str(self.data_dir)}

    def close(self) -> int:
        self.client.close()
        return _stop(self.proc)


class WorkerProcess:
    """``python -m sequence_ai_server.worker`` on an ephemeral port, without a gateway."""

    def __init__(self, proc: subprocess.Popen, info: dict, secret: str, log_path: Path, ready: Path):
        self.proc = proc
        self.info = info
        self.port: int = info["port"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secret
        self.log_path = log_path
        self.ready_file = ready
        self.client = httpx.Client(base_url=self.url, timeout=30.0)

    @classmethod
    def start(cls, file: str, tmp: Path, *, name: str = "w", class_name: Optional[str] = None,
              env: Optional[dict] = None, timeout: float = 30.0, wait: bool = True) -> "WorkerProcess":
        tmp = Path(tmp)
        secret = secrets.token_urlsafe(16)
        ready = tmp / f"{name}.ready.json"
        log_path = tmp / f"{name}.log"
        cmd = [sys.executable, "-m", "sequence_ai_server.worker", "--file", str(file), "--port", "0",
               "--ready-file", str(ready), "--name", name, "--weights-dir", str(tmp / f"{name}-weights")]
        if class_name:
            cmd += ["--class", class_name]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env=_env({"SEQ_WORKER_SECRET": secret, **(env or {})}))
        info = _wait_file(ready, proc, timeout, log_path) if wait else {"port": 0}
        return cls(proc, info, secret, log_path, ready)

    def act(self, body: dict, secret: Optional[str] = None, **kw: Any) -> httpx.Response:
        token = self.secret if secret is None else secret
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return self.client.post("/act", json=body, headers=headers, **kw)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        self.client.close()
        return _stop(self.proc)


_restart_count = itertools.count()


def gateway_on_data_dir(tmp: Path, port: int = 0, env: Optional[dict] = None) -> "GatewayProcess":
    """A gateway process on ``port`` (0: any free one) with the data dir ``tmp/seq-home``, the same
    on every call: what a test of a gateway restart (SIGKILL, then a new gateway on that data dir)
    starts each time. Each call has its own ready file and log (``tmp/gateway-N.*``)."""
    n = next(_restart_count)
    ready, log_path = tmp / f"gateway-{n}.ready.json", tmp / f"gateway-{n}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sequence_ai_server.gateway", "--port", str(port),
                                 "--data-dir", str(tmp / "seq-home"), "--ready-file", str(ready)],
                                stdout=log, stderr=subprocess.STDOUT, env=_env(env), cwd=str(tmp))
    info = _wait_file(ready, proc, 60.0, log_path)
    return GatewayProcess(proc, tmp / "seq-home", info, log_path)
