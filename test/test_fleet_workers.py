"""Several workers per deployment, for real: a gateway process, a CPU policy with one slot per
worker and ``max_gpus=2`` (a CPU policy's max_gpus counts its workers, up to $SEQ_CPU_WORKERS),
and two robots on the real client. The second robot finds the first worker's slot taken, a
second worker process starts for it, and both robots are served at once, each by its own
worker (two pids), which GET /v1/deployments/{name} and `seq policy status` show."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _core_support import ECHO, connect, observation
from _servers import ROOT, GatewayProcess, _env

SEQ_MAIN = "from seq.cli import main; main()"


def _one_slot_two_workers(tmp_path: Path) -> str:
    src = Path(ECHO).read_text()
    assert src.count("@seq.policy(\n") == 1
    path = tmp_path / "fleet_echo.py"
    path.write_text(src.replace("@seq.policy(\n", '@seq.concurrent(replicas_per_gpu=1)\n'
                                                  '@seq.policy(gpu="cpu", max_gpus=2, idle_timeout=600,\n'))
    return str(path)


def test_two_robots_are_served_at_once_by_two_worker_processes(tmp_path):
    gw = GatewayProcess.start(tmp_path, env={"SEQ_CPU_WORKERS": "2"})
    try:
        gw.deploy(_one_slot_two_workers(tmp_path), "fleet")
        with connect(gw, "fleet") as a:
            assert a.predict(observation()) is not None       # robot a holds the first worker's slot
            with connect(gw, "fleet") as b:                   # every slot taken: a second worker starts
                b.wait_until_ready()
                assert b.predict(observation()) is not None
                assert a.predict(observation()) is not None   # both served at once
                workers = gw.client.get("/v1/deployments/fleet").json()["workers"]
                assert [(w["worker"], w["slots"], len(w["robots"]), w["cards"]) for w in workers] == [
                    ("fleet", {"used": 1, "total": 1}, 1, []), ("fleet#2", {"used": 1, "total": 1}, 1, [])]
                assert len({w["pid"] for w in workers}) == 2 and all(w["pid"] for w in workers)
                assert workers[0]["max_workers"] == 2
                r = subprocess.run([sys.executable, "-c", SEQ_MAIN, "policy", "status", "fleet"], capture_output=True,
                                   text=True, env=_env({**gw.env(), "COLUMNS": "250"}), timeout=60, cwd=str(ROOT))
                assert r.returncode == 0, r.stderr
                assert "workers   2 of at most 2" in r.stdout and "fleet#2" in r.stdout, r.stdout
                assert "not used self-hosted" not in r.stdout
    finally:
        gw.close()
