"""Real gateway and worker processes: a worker frozen with SIGSTOP (alive, answering nothing) is
jammed like a degraded one (connects get 503 warming, phase ``replacing``), a fresh worker of the
same version takes over and serves, and the frozen one is killed and gives its card back; and a
gateway SIGKILLed and restarted on its data dir goes on counting an adopted worker's usage where
it stopped instead of counting it again."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from _servers import gateway_on_data_dir, GatewayProcess


POLICY = '''
import seq


@seq.policy(gpu={gpu!r}, idle_timeout=600)
class Plain(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, inputs):
        return {{"echo": inputs}}
'''


def _policy(tmp: Path, name: str, gpu: str) -> str:
    f = tmp / f"{name}.py"
    f.write_text(POLICY.format(gpu=gpu))
    return str(f)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _act(conn: dict, body: dict) -> httpx.Response:
    return httpx.post(conn["worker_url"] + "/act", json={"observation": body}, trust_env=False,
                      headers={"Authorization": f"Bearer {conn['direct_secret']}"}, timeout=30)


def _holders(gw: GatewayProcess) -> list:
    return sorted((h["deployment"], h["pid"]) for c in gw.client.get("/v1/gpus").json()["cards"] for h in c["held_by"])


def test_a_sigstopped_worker_is_replaced_by_a_fresh_one_and_killed(tmp_path):
    # pings every 0.5 s that give up after 2 s: a worker silent for two of them (4 s) is jammed (10 s by default)
    gw = GatewayProcess.start(tmp_path, env={"SEQ_FAKE_GPUS": "L4,L4", "SEQ_HEALTH_INTERVAL_S": "0.5",
                                             "SEQ_PING_TIMEOUT_S": "2"})
    frozen_pid = None
    try:
        d = gw.deploy(_policy(tmp_path, "frozen", "L4"), "frozen")
        assert d["status"] == "ready", d
        frozen_pid = d["pid"]
        conn = gw.connect_ready("frozen")
        assert _act(conn, {"i": 1}).status_code == 200
        assert _holders(gw) == [("frozen", frozen_pid)]

        os.kill(frozen_pid, signal.SIGSTOP)
        t0 = time.monotonic()
        seen_503 = None
        while True:                                    # connects go to it until the health check notices
            r = gw.connect("frozen")
            if r.status_code == 503:
                seen_503 = r.json()
                break
            assert r.status_code == 200 and time.monotonic() - t0 < 30, (r.status_code, r.text)
            time.sleep(0.2)
        detected_s = time.monotonic() - t0
        print(f"frozen worker detected after {detected_s:.1f} s")
        assert seen_503["code"] == "warming" and seen_503["details"]["phase"] == "replacing", seen_503
        assert "answered no /ping" in seen_503["detail"]
        assert detected_s < 20, detected_s
        health = gw.status("frozen")["health"]
        assert health["state"] in ("jammed", "replaced") and health["pid"] == frozen_pid
        assert health["reason"] == "not_answering"

        t1 = time.monotonic()
        doctor = gw.client.get("/v1/deployments/frozen/doctor").json()   # the row may still name the frozen one
        assert time.monotonic() - t1 < 10

        new = gw.connect_ready("frozen", timeout=60)   # the fresh worker took over
        after = gw.status("frozen")
        assert after["pid"] != frozen_pid and after["health"]["state"] == "replaced"
        assert after["health"]["new_pid"] == after["pid"] and new["worker_url"] != conn["worker_url"]
        r = _act(new, {"i": 2})
        assert r.status_code == 200 and r.json()["outputs"]["echo"] == {"i": 2}

        deadline = time.monotonic() + 20               # SIGTERM stays pending on a stopped process: SIGKILL ends it
        while _alive(frozen_pid):
            assert time.monotonic() < deadline, "the frozen worker was never ended"
            time.sleep(0.1)
        deadline = time.monotonic() + 10               # and its card is free again
        while _holders(gw) != [("frozen", after["pid"])]:
            assert time.monotonic() < deadline, _holders(gw)
            time.sleep(0.1)
        assert doctor["name"] == "frozen"
    finally:
        if frozen_pid and _alive(frozen_pid):
            os.kill(frozen_pid, signal.SIGCONT)
        gw.close()


def test_usage_is_not_counted_again_after_a_gateway_restart(tmp_path):
    fast = {"SEQ_HEALTH_INTERVAL_S": "0.3"}             # usage comes in with the health pings
    gws = [gateway_on_data_dir(tmp_path, env=fast)]
    try:
        d = gws[0].deploy(_policy(tmp_path, "meter", "cpu"), "meter")
        assert d["status"] == "ready", d
        port = gws[0].info["port"]
        conn = gws[0].connect_ready("meter")
        sent = 0
        for i in range(20):
            r = _act(conn, {"i": i})
            assert r.status_code == 200
            sent += len(r.request.content)

        def totals(gw: GatewayProcess) -> dict:
            return gw.client.get("/v1/deployments/meter/usage").json()["totals"]

        deadline = time.monotonic() + 30
        while totals(gws[0])["requests"] != 20:
            assert time.monotonic() < deadline, totals(gws[0])
            time.sleep(0.1)
        assert totals(gws[0])["bytes_in"] == sent

        gws[0].client.close()
        gws[0].proc.send_signal(signal.SIGKILL)
        gws[0].proc.wait()
        gws.append(gateway_on_data_dir(tmp_path, port=port, env=fast))
        gw = gws[-1]
        assert gw.status("meter")["pid"] == d["pid"]     # adopted
        time.sleep(1.5)                                  # five health rounds: nothing is counted again
        t = totals(gw)
        assert t["requests"] == 20 and t["bytes_in"] == sent, t

        conn = gw.connect_ready("meter")                 # what it serves after the restart still counts
        for i in range(5):
            r = _act(conn, {"j": i})
            assert r.status_code == 200
            sent += len(r.request.content)
        deadline = time.monotonic() + 30
        while totals(gw)["requests"] < 25:
            assert time.monotonic() < deadline, totals(gw)
            time.sleep(0.1)
        time.sleep(1.0)                                  # three more rounds: still 25, not more
        t = totals(gw)
        assert t["requests"] == 25 and t["bytes_in"] == sent, t
    finally:
        for g in gws:
            if g.proc.poll() is None:
                g.close()
