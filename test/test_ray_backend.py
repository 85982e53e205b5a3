"""Workers placed by Ray (server/sequence_ai_server/ray_backend.py) behind the real gateway.

One Ray head on 127.0.0.1 (small memory settings, no dashboard) is started for the module and
stopped by PID at the end; the gateway runs with ``SEQ_BACKEND=ray``. The robot path stays
direct: connect at the gateway, ``/act`` straight to the worker the actor runs."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from _core_support import ECHO, Recorder, connect, observation, unique
from _servers import GatewayProcess, ROOT
from sequence_ai_server.ray_backend import actor_options, declared_resources, max_workers

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """``ray start --head --block`` on loopback; yields its GCS address."""
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="/tmp/rayt")      # short: Ray's unix socket paths are length-limited
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "server"), os.environ.get("PYTHONPATH", "")]))
    ray_bin = str(Path(sys.executable).parent / "ray")
    log = open(Path(temp) / "head.log", "wb")
    proc = subprocess.Popen([ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=4", "--num-gpus=0", "--object-store-memory=100000000",
                             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (Path(temp) / "head.log").read_text()[-3000:]
        if "Ray runtime started" in (Path(temp) / "head.log").read_text():
            break
        time.sleep(0.2)
    else:
        raise TimeoutError((Path(temp) / "head.log").read_text()[-3000:])
    try:
        yield f"127.0.0.1:{port}"
    finally:
        # SIGTERM alone leaves Ray processes alive: collect the whole tree first, then kill by PID
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        for pid in tree:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(2)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def ray_gateway(ray_head, tmp_path_factory):
    gw = GatewayProcess.start(tmp_path_factory.mktemp("ray-gw"),
                              env={"SEQ_BACKEND": "ray", "SEQ_RAY_ADDRESS": ray_head}, timeout=90)
    yield gw
    gw.close()


@pytest.fixture(scope="module")
def ray_echo(ray_gateway):
    """The echo policy deployed once on Ray (each deploy boots an actor: ~10 s on 2 cores)."""
    name = unique("ray-echo")
    dep = ray_gateway.deploy(ECHO, name, wait=True, timeout=90)
    assert dep["status"] == "ready", dep
    return name


def _worker_pid(gw, name: str) -> int:
    """The worker's pid, from the ready file the gateway mirrored from the actor."""
    for path in sorted((gw.data_dir / "run").glob(f"{name}.*.ready.json"), key=lambda p: p.stat().st_mtime):
        pid = json.loads(path.read_text())["pid"]
    return pid


def test_policy_resources_map_to_actor_options(tmp_path):
    f = tmp_path / "p.py"
    f.write_text("import seq\n@seq.policy(gpu='H100:2', max_gpus=6, cpu=(2, 4), memory=8)\nclass P(seq.Policy):\n    pass\n")
    res = declared_resources(str(f))
    assert res == {"gpu": "H100:2", "max_gpus": 6, "cpu": (2, 4), "memory": 8}
    assert actor_options(res) == {"num_cpus": 2.0, "num_gpus": 2, "memory": 8 << 30}
    assert max_workers(res) == 3
    assert actor_options(declared_resources(ECHO)) == {"num_cpus": 1.0, "num_gpus": 0}
    assert max_workers(declared_resources(ECHO)) is None


def test_echo_policy_on_a_ray_actor_serves_the_normal_client_without_underruns(ray_gateway, ray_echo):
    name = ray_echo
    ray_gateway.connect_ready(name, timeout=90)
    worker = _worker_pid(ray_gateway, name)
    actor = psutil.Process(worker).parent()
    assert "ray" in " ".join(actor.cmdline()).lower() or "Worker" in actor.name(), actor.cmdline()
    rec = Recorder()
    with connect(ray_gateway, name, params={"chunk_len": 10}) as policy:
        out = policy.run(observation, rec, max_actions=45, progress=False)
    assert out.reason == "completed" and out.actions == 45 and out.underruns == 0, out
    assert rec.rows[0][1] == 0.0 and rec.rows[0][0] >= 1.0
    # the robot talked to the worker, not the gateway: the lease points straight at it
    body = ray_gateway.connect_ready(name)
    assert body["worker_url"].startswith("http://127.0.0.1:") and body["worker_url"] != ray_gateway.url
    assert "starting " + name in ray_gateway.log(name)     # the actor's worker log reached the gateway


def test_scale_from_zero_answers_503_then_serves(ray_gateway, ray_echo):
    name = ray_echo
    ray_gateway.connect_ready(name, timeout=90)
    ray_gateway.stop(name)
    first = ray_gateway.connect(name)
    assert first.status_code == 503 and first.json()["code"] == "warming", first.text
    assert float(first.headers["Retry-After"]) > 0
    body = ray_gateway.connect_ready(name, timeout=90)
    r = httpx.get(body["worker_url"] + "/ping", timeout=5)
    assert r.status_code == 200
    with connect(ray_gateway, name) as policy:
        out = policy.run(observation, Recorder(), max_actions=5, progress=False)
    assert out.actions == 5


def test_worker_actor_killed_mid_run_fires_hold_and_the_next_connect_recovers(ray_gateway, ray_echo):
    name = ray_echo
    ray_gateway.connect_ready(name, timeout=120)
    worker = _worker_pid(ray_gateway, name)
    actor = psutil.Process(worker).parent().pid
    rec = Recorder()
    outcome: dict = {}

    def drive():
        try:
            with connect(ray_gateway, name, params={"chunk_len": 4}) as policy:
                outcome["out"] = policy.run(observation, rec, hold=rec.hold, max_actions=600, progress=False)
        except Exception as exc:  # noqa: BLE001 - the run is expected to end with an error
            outcome["exc"] = exc

    t = threading.Thread(target=drive)
    t.start()
    deadline = time.monotonic() + 30
    while len(rec.rows) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(rec.rows) >= 10, "the run never started"
    os.kill(actor, signal.SIGKILL)               # the actor dies; its worker follows it
    os.kill(worker, signal.SIGKILL)
    t.join(timeout=60)
    assert not t.is_alive()
    assert rec.holds >= 1, outcome
    assert "exc" in outcome or outcome["out"].actions < 600, outcome
    assert all(ti <= rec.hold_times[0] for ti in rec.times)
    # the next connect starts a new actor (503 while it boots) and serves again
    body = ray_gateway.connect_ready(name, timeout=120)
    assert _worker_pid(ray_gateway, name) != worker
    with connect(ray_gateway, name) as policy:
        out = policy.run(observation, Recorder(), max_actions=5, progress=False)
    assert out.actions == 5 and body["worker_url"].startswith("http://127.0.0.1:")
