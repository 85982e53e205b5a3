"""Several workers per deployment, for real: a gateway process, a CPU policy with one slot per
worker and ``max_gpus=2`` (a CPU policy's max_gpus counts its workers, up to $SEQ_CPU_WORKERS),
and two robots on the real client. The second robot finds the first worker's slot taken, a
second worker process starts for it, and both robots are served at once, each by its own
worker (two pids), which GET /v1/deployments/{name} and `seq policy status` show."""
from __future__ import annotations

from pathlib import Path

from _core_support import ECHO, connect, observation
from _servers import GatewayProcess, seq_cli


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
                r = seq_cli(gw, "policy", "status", "fleet")
                assert r.returncode == 0, r.stderr
                assert "workers   2 of at most 2" in r.stdout and "fleet#2" in r.stdout, r.stdout
                assert "admitted 1 of at most 1 robots" in r.stdout, r.stdout     # each worker's admission
                assert "not used self-hosted" not in r.stdout
    finally:
        gw.close()


def test_a_restarted_gateway_adopts_both_workers_and_their_sessions(tmp_path):
    import httpx
    import signal

    from _servers import echo_observation
    gws = [GatewayProcess.start(tmp_path, env={"SEQ_CPU_WORKERS": "2", "SEQ_LEASE_TTL_S": "30"})]
    try:
        gw = gws[0]
        gw.deploy(_one_slot_two_workers(tmp_path), "fleet")
        a = gw.connect_ready("fleet")
        b = gw.connect_ready("fleet")                          # waits out the second worker's start
        assert a["worker_url"] != b["worker_url"]
        before = {w["worker"]: w["pid"] for w in gw.status("fleet")["workers"]}
        assert len(set(before.values())) == 2
        gw.client.close()
        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait()
        (tmp_path / "gateway.ready.json").unlink()            # the new gateway writes its own
        gws.append(GatewayProcess.start(tmp_path, env={"SEQ_CPU_WORKERS": "2", "SEQ_LEASE_TTL_S": "30"}))
        gw = gws[-1]
        workers = gw.status("fleet")["workers"]
        assert {w["worker"]: w["pid"] for w in workers} == before, workers
        assert [len(w["robots"]) for w in workers] == [1, 1]
        for conn in (a, b):                                   # each renews on its own worker and acts there
            r = gw.client.post(f"/v1/sessions/{conn['session_id']}/renew")
            assert r.status_code == 200 and r.json()["worker_url"] == conn["worker_url"], r.text
            act = httpx.post(conn["worker_url"] + "/act", json={"observation": echo_observation()},
                             headers={"Authorization": f"Bearer {r.json()['direct_secret']}"}, timeout=30)
            assert act.status_code == 200, act.text
    finally:
        for g in gws:
            if g.proc.poll() is None:
                g.close()


def test_a_frozen_second_worker_is_retired_alone_and_its_robot_reconnects_elsewhere(tmp_path):
    import os
    import signal

    import httpx

    from _servers import echo_observation
    from _wait import eventually
    # pings every 0.5 s that give up after 2 s: a worker silent for two of them (4 s) is jammed (10 s by default)
    gw = GatewayProcess.start(tmp_path, env={"SEQ_CPU_WORKERS": "2", "SEQ_HEALTH_INTERVAL_S": "0.5",
                                             "SEQ_PING_TIMEOUT_S": "2"})
    frozen = None
    try:
        gw.deploy(_one_slot_two_workers(tmp_path), "fleet")
        a = gw.connect_ready("fleet")
        b = gw.connect_ready("fleet")                          # on the second worker
        pids = {w["worker"]: w["pid"] for w in gw.status("fleet")["workers"]}
        frozen = pids["fleet#2"]
        os.kill(frozen, signal.SIGSTOP)                        # alive, answering nothing
        eventually(lambda: frozen not in {w["pid"] for w in gw.status("fleet")["workers"]}, timeout=60,
                   what="the frozen fleet#2 retired", detail=lambda: gw.log("fleet")[-2000:])
        eventually(lambda: not os.path.exists(f"/proc/{frozen}") or
                   open(f"/proc/{frozen}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", timeout=30,
                   what="the frozen worker killed")
        status = gw.status("fleet")
        assert status["health"] is None and status["pid"] == pids["fleet"]       # the first worker untouched
        r = gw.client.post(f"/v1/sessions/{a['session_id']}/renew")
        assert r.status_code == 200 and r.json()["worker_url"] == a["worker_url"], r.text
        act = httpx.post(a["worker_url"] + "/act", json={"observation": echo_observation()}, trust_env=False,
                         headers={"Authorization": f"Bearer {r.json()['direct_secret']}"}, timeout=30)
        assert act.status_code == 200, act.text
        assert gw.client.post(f"/v1/sessions/{b['session_id']}/renew").status_code == 401   # lease_expired
        c = gw.connect_ready("fleet")                          # b's robot reconnects: the fresh fleet#2
        assert c["worker_url"] not in (a["worker_url"], b["worker_url"])
        workers = {w["worker"]: w for w in gw.status("fleet")["workers"]}
        assert workers["fleet#2"]["pid"] != frozen and workers["fleet#2"]["jammed"]["pid"] == frozen
    finally:
        if frozen is not None:
            try:
                os.kill(frozen, signal.SIGKILL)
            except ProcessLookupError:
                pass
        gw.close()
