"""A jammed worker (issue 5): a worker whose infer hangs still answers /ping, but as `degraded`
with the age of its oldest inference once that passes timeouts.request; the gateway's health
check sees it, `seq policy status`/`doctor` report it, a fresh worker of the same version starts,
new sessions go there, and the jammed one is stopped. Real gateway, workers and `seq` CLI."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from _servers import POLICIES, seq_cli

HANG_POLICY = str(POLICIES / "hang_policy.py")


def _act(conn: dict, **params) -> httpx.Response:
    return httpx.post(conn["worker_url"] + "/act", json={"observation": {"proprioception": {"joint_positions": [0.0, 0.0]},
                                                         "instruction": "hold still"},
                                                         "params": params},
                      headers={"Authorization": f"Bearer {conn['direct_secret']}"}, timeout=30)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_worker_whose_infer_hangs_is_reported_and_replaced(shared_module_gateway):
    gw = shared_module_gateway
    d = gw.deploy(HANG_POLICY, "jam")
    assert d["status"] == "ready", d
    old_pid = d["pid"]
    conn = gw.connect_ready("jam")
    assert _act(conn).status_code == 200
    ping = httpx.get(conn["worker_url"] + "/ping").json()
    assert ping["status"] == "ready" and ping["oldest_request_s"] == 0.0 and ping["request_timeout_s"] == 1.0

    hung: list = []
    t = threading.Thread(target=lambda: hung.append(_act(conn, hang=True)), daemon=True)
    t.start()
    t.join(20)
    assert hung and hung[0].status_code == 504 and hung[0].json()["code"] == "request_timeout"
    ping = httpx.get(conn["worker_url"] + "/ping", timeout=5)    # still answers, but degraded
    assert ping.status_code == 200 and ping.json()["status"] == "degraded" and ping.json()["oldest_request_s"] > 1.0

    deadline = time.monotonic() + 30                   # the health check (every 2 s) sees it
    while (gw.status("jam").get("health") or {}).get("state") not in ("jammed", "replaced"):
        assert time.monotonic() < deadline, gw.status("jam")
        time.sleep(0.1)
    health = gw.status("jam")["health"]
    assert health["pid"] == old_pid and health["oldest_request_s"] > 1.0 and health["request_timeout_s"] == 1.0

    new = gw.connect_ready("jam", timeout=60)          # 503 warming until the fresh worker took over
    after = gw.status("jam")
    assert after["health"]["state"] == "replaced" and after["health"]["new_pid"] == after["pid"] != old_pid
    assert new["worker_url"] != conn["worker_url"] and new["version"] == d["version"]
    r = _act(new)
    assert r.status_code == 200 and len(r.json()["action_chunk"]["actions"]) == 4
    try:                                               # the jammed worker's robots must reconnect
        assert _act(conn).status_code == 401           # its secret was rotated ...
    except httpx.ConnectError:
        pass                                           # ... or it is gone already

    r = seq_cli(gw, "policy", "status", "jam")
    assert r.returncode == 0 and f"worker pid {old_pid} replaced by pid {after['pid']}" in r.stdout
    r = seq_cli(gw, "policy", "doctor", "jam")
    assert r.returncode == 0 and "ping        200 ready" in r.stdout and f"now pid {after['pid']}" in r.stdout

    deadline = time.monotonic() + 30                   # the jammed one is stopped (killed past the grace)
    while _alive(old_pid):
        assert time.monotonic() < deadline
        time.sleep(0.2)
