"""Platform operations on a real gateway and workers over loopback: scheduled scaling (a floor
set with the CLI keeps a real worker warm until it is cleared; a weekly window opening and closing
is proven in process, on a Gateway with an injected clock the test moves), usage metering,
limits per account and per key, signed webhook alerts to a real HTTP receiver, and the card
inventory with the ``gpu=`` check at deploy. Plus the pure parts (windows, nvidia-smi CSV,
signatures) as unit tests."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from zoneinfo import ZoneInfo

import httpx
import pytest

from _servers import ECHO_POLICY, POLICIES, GatewayProcess, _env, seq_cli
from _wait import eventually
from _fake_workers import Clock, FakeLauncher

from seq.cli.ops import scale_line
from sequence_ai_server.common.config import ServerConfig
from sequence_ai_server.gateway.controller import Gateway
from sequence_ai_server.gateway.events import WorkerStopped
from sequence_ai_server.gateway.schemas import DeployRequest

from sequence_ai_server.ops.alerts import sign, verify_signature
from sequence_ai_server.ops.gpus import gpu_refusal, parse_nvidia_smi_csv
from sequence_ai_server.ops.schedule import parse_window
from sequence_ai_server.ops.usage import dir_bytes

OPS = str(POLICIES / "ops_policy.py")
H100 = str(POLICIES / "h100_policy.py")
BROKEN = str(POLICIES / "broken_load_policy.py")
BERLIN = ZoneInfo("Europe/Berlin")


def _act(conn: dict, observation: dict) -> httpx.Response:
    body = json.dumps({"observation": observation}).encode()
    return httpx.post(conn["worker_url"] + "/act", content=body, timeout=30,
                      headers={"Authorization": f"Bearer {conn['direct_secret']}", "Content-Type": "application/json"})


@pytest.fixture(scope="module")
def _ops_gateway_process(tmp_path_factory):
    gw = GatewayProcess.start(tmp_path_factory.mktemp("ops"),
                              env={"SEQ_HEALTH_INTERVAL_S": "0.3", "SEQ_ALERT_BACKOFF_S": "0.2,0.2,0.2,0.2"})
    try:
        yield gw
    finally:
        gw.close()


def _deployments(gw) -> set:
    return {d["name"] for d in gw.client.get("/v1/deployments").json()["deployments"]}


@pytest.fixture
def ops_gateway(_ops_gateway_process):
    """The module's gateway with fast health pings and fast alert retries (one process for the
    module: a start and stop is ~1 s of CPU). Each test uses deployment names of its own; when it
    ends, what it deployed is removed (its workers stopped) and the account's limits cleared, so
    the next test finds no worker and no limit."""
    gw = _ops_gateway_process
    before = _deployments(gw)
    try:
        yield gw
    finally:
        for name in sorted(_deployments(gw) - before):
            gw.client.post(f"/v1/deployments/{name}/remove", params={"force": "true"}).raise_for_status()
        gw.client.post("/v1/account/limits", json={"clear": ["all"]}).raise_for_status()


# ------------------------------------------------------------------ pure parts

def test_a_window_opens_and_closes_by_the_local_time_of_its_zone():
    w = parse_window("Mon-Fri 08:00-18:00")
    at = lambda *a: datetime(*a, tzinfo=BERLIN)   # noqa: E731   2026-11-30 is a Monday
    assert not w.active(at(2026, 11, 30, 7, 59)) and w.active(at(2026, 11, 30, 8, 0))
    assert w.active(at(2026, 12, 4, 17, 59)) and not w.active(at(2026, 12, 4, 18, 0))
    assert not w.active(at(2026, 12, 5, 12, 0))                       # Saturday
    assert w.next_change(at(2026, 11, 30, 7, 59)) == at(2026, 11, 30, 8, 0)
    night = parse_window("Fri-Mon 22:00-06:00")                        # wraps the week and midnight
    assert night.active(at(2026, 12, 4, 23, 0)) and night.active(at(2026, 12, 5, 5, 59))
    assert night.active(at(2026, 12, 8, 5, 0)) and not night.active(at(2026, 12, 8, 22, 0))   # Tue 05:00 ends Mon's
    for bad, msg in (("Mon-Fri", "is not a window"), ("Mon-Fxi 08:00-18:00", "'Fxi' .* is not a day"),
                     ("Mon 25:00-26:00", "is not a time of day"), ("Mon 08:00-08:00", "same minute")):
        with pytest.raises(ValueError, match=msg):
            parse_window(bad)


def test_nvidia_smi_csv_becomes_cards_and_a_missing_card_is_refused_naming_what_exists():
    text = ("0, NVIDIA H200, 143771, GPU-5a1b\n"
            "1, NVIDIA A100-SXM4-80GB, 81920, GPU-77c2\n"
            "2, NVIDIA GeForce RTX 4090, [N/A], GPU-0f00\n\n")
    cards = parse_nvidia_smi_csv(text)
    assert [(c["index"], c["type"], c["memory_mib"]) for c in cards] == [(0, "H200", 143771), (1, "A100", 81920),
                                                                         (2, "RTX4090", None)]
    with pytest.raises(ValueError, match="line 1 has 2 fields"):
        parse_nvidia_smi_csv("0, NVIDIA H200\n")
    inv = {"types": {"H200": 1, "A100": 1}, "cpu": {"cores": 16}, "error": None}
    assert gpu_refusal("h200", inv) is None and gpu_refusal(["L4", "A100"], inv) is None
    assert gpu_refusal("cpu", inv) is None and gpu_refusal(None, inv) is None
    why = gpu_refusal("H200:2", inv)
    assert why["reason"] == "gpu_unavailable" and "asks for H200:2" in why["detail"] and "A100 x1, H200 x1" in why["detail"]
    cpu_box = gpu_refusal("L4", {"types": {}, "cpu": {"cores": 2}, "error": None})
    assert "no GPU (a CPU machine: 2 cores)" in cpu_box["detail"]


def test_a_signature_covers_the_timestamp_and_the_body_and_an_old_one_is_refused():
    body, ts = b'{"event":"test"}', "1800000000"
    sig = sign("whsec_x", ts, body)
    assert sig.startswith("sha256=") and len(sig) == 7 + 64
    assert verify_signature("whsec_x", ts, body, sig, now=1800000010)
    assert not verify_signature("whsec_y", ts, body, sig, now=1800000010)          # another secret
    assert not verify_signature("whsec_x", ts, body + b" ", sig, now=1800000010)   # another body
    assert not verify_signature("whsec_x", "1800000001", body, sig, now=1800000010)  # another timestamp
    assert not verify_signature("whsec_x", ts, body, sig, now=1800000000 + 301)     # replayed later


# ------------------------------------------------------------------ scheduled scaling

def test_a_scheduled_window_opens_and_closes_on_the_gateways_clock_and_the_worker_idles_out_after(tmp_path):
    """In process (a Gateway over _fake_workers.FakeLauncher, ticked by hand): the window
    is read on the clock the Gateway is given, so the test moves that clock across the window's
    edges; the worker's own idle time runs on the same clock."""
    clock = Clock(datetime(2026, 11, 30, 7, 59, tzinfo=BERLIN).timestamp())     # a Monday, 07:59 in Berlin
    launcher = FakeLauncher()
    gw = Gateway(config=ServerConfig(data_dir=tmp_path / "home", health_interval_s=1e9), launcher=launcher, clock=clock)
    stopped: list = []
    gw.supervisor.on(WorkerStopped, stopped.append)
    spec = {"contract": {"action": None, "observation": None}, "params": [], "idle_timeout": 2.0}

    def at(hour: int, minute: int, second: float = 0.0) -> None:
        clock.t = datetime(2026, 11, 30, hour, minute, tzinfo=BERLIN).timestamp() + second
        gw.tick(clock.t)

    try:
        gw.deployments.deploy(DeployRequest(name="sched", file=OPS))
        launcher.started[0].ready(spec, 9001)
        at(7, 59, 0.1)
        assert gw.store.get("sched").status == "ready"
        at(7, 59, 3.0)                                           # idle_timeout 2 s with no robot: stopped
        assert (gw.store.get("sched").status, gw.store.get("sched").phase) == ("stopped", "idle")

        gw.ops.scales.set("sched", 1, "Mon-Fri 08:00-18:00", "Europe/Berlin")
        assert scale_line(gw.ops.scale_view("sched")) == ("  scale     min 1 during Mon-Fri 08:00-18:00 (Europe/Berlin); "
                                                          "closed now: workers idle out, opens Mon 2026-11-30 07:00 UTC")
        at(7, 59, 59.9)                                          # closed: nothing starts
        assert len(launcher.started) == 1 and gw.store.get("sched").status == "stopped"

        at(8, 0)                                                 # it opens: the floor starts a worker
        assert len(launcher.started) == 2 and gw.store.get("sched").status == "starting"
        worker = launcher.started[1]
        worker.ready(spec, 9002)
        at(8, 0, 0.1)
        assert gw.store.get("sched").status == "ready"
        assert scale_line(gw.ops.scale_view("sched")).endswith("open now: 1 kept warm, closes Mon 2026-11-30 17:00 UTC")
        for hour in (8, 12, 17):                                 # hours with no robot: kept warm
            at(hour, 30)
        at(17, 59, 59.9)
        assert gw.store.get("sched").status == "ready" and worker.signals == [] and len(launcher.started) == 2

        at(18, 0)                                                # it closes; idle_timeout counts from here
        at(18, 0, 1.5)
        assert gw.store.get("sched").status == "ready" and worker.signals == []
        at(18, 0, 2.1)
        assert (gw.store.get("sched").status, gw.store.get("sched").phase) == ("stopped", "idle")
        assert worker.signals == [signal.SIGTERM] and stopped[-1] == WorkerStopped("sched", "idle")
        view = gw.ops.scale_view("sched")["scale"]
        assert view["active"] is False and view["warm_now"] == 0
        at(18, 30)
        assert len(launcher.started) == 2                        # nothing starts again until it reopens
    finally:
        gw.close()


def test_a_floor_set_with_the_cli_keeps_the_real_worker_warm_until_it_is_cleared(ops_gateway):
    gw = ops_gateway
    d = gw.deploy(OPS, "sched")
    assert d["status"] == "ready", d
    eventually(lambda: gw.status("sched")["phase"] == "idle", 30, 0.1, what="the idle worker to stop")

    r = seq_cli(gw, "policy", "scale", "sched", "--min", "1")
    assert r.returncode == 0, r.stderr
    assert "min 1 always; open now: 1 kept warm" in r.stdout, r.stdout
    eventually(lambda: gw.status("sched")["status"] == "ready", 60, 0.1, what="the floor's worker to start")
    pid = gw.status("sched")["pid"]
    r = seq_cli(gw, "policy", "status", "sched")
    assert r.returncode == 0 and "open now: 1 kept warm" in r.stdout, r.stdout
    time.sleep(3.0)                                   # 1.5 x idle_timeout with no robot: kept warm
    assert gw.status("sched")["status"] == "ready" and gw.status("sched")["pid"] == pid

    r = gw.client.post("/v1/deployments/sched/scale", json={"clear": True})   # (timed here, not after a CLI exits)
    cleared = time.monotonic()
    assert r.status_code == 200 and r.json()["scale"] is None, r.text
    eventually(lambda: gw.status("sched")["phase"] == "idle", 30, 0.1, what="the worker to idle out")
    assert time.monotonic() - cleared >= 1.5         # idle_timeout (2 s) counts from the clear

    r = seq_cli(gw, "policy", "scale", "sched", "--min", "1", "--during", "Mon-Fri 8am", "--tz", "Europe/Berlin")
    assert r.returncode == 5 and "is not a window" in r.stderr
    r = seq_cli(gw, "policy", "scale", "sched", "--min", "1", "--tz", "Mars/Olympus")
    assert r.returncode == 5 and "unknown time zone 'Mars/Olympus'" in r.stderr
    assert gw.client.get("/v1/deployments/sched/scale").json()["scale"] is None      # nothing was stored
    assert seq_cli(gw, "policy", "scale", "sched", "--clear").returncode == 0


# ------------------------------------------------------------------ usage

def test_usage_counts_worker_seconds_requests_errors_and_bytes_per_deployment(ops_gateway):
    gw = ops_gateway
    t0 = time.time()
    assert gw.deploy(OPS, "meter")["status"] == "ready"
    conn = gw.connect_ready("meter")
    sent = received = 0
    answers = []
    for i in range(5):
        body = {"op": "echo", "i": i, "pad": "x" * (100 * i)}
        r = _act(conn, body)
        answers.append(r.status_code)
        sent += len(json.dumps({"observation": body}).encode())
        received += len(r.content)
    r = _act(conn, {"op": "fail"})
    answers.append(r.status_code)
    sent += len(json.dumps({"observation": {"op": "fail"}}).encode())
    received += len(r.content)
    r = _act({**conn, "direct_secret": "not-the-secret"}, {"op": "echo"})    # refused before the body is read
    answers.append(r.status_code)
    received += len(r.content)
    assert answers == [200] * 5 + [500, 401]

    u = eventually(lambda: (lambda v: v if v["totals"]["requests"] == 7 else None)(
                       gw.client.get("/v1/deployments/meter/usage").json()), 30, 0.1,
                   what="the gateway to collect 7 requests")
    t = u["totals"]
    assert t["errors"] == 1 and t["bytes_in"] == sent and t["bytes_out"] == received
    assert set(t["worker_s"]) == {"cpu"} and 0.0 < t["worker_s"]["cpu"] <= time.time() - t0 + 1.5
    assert u["last_hour"]["requests"] == 7 and u["last_hour"]["errors"] == 1 and u["last_hour"]["p95_ms"] > 0
    assert u["captured_bytes"] == dir_bytes(gw.data_dir / "capture" / "meter")

    r = seq_cli(gw, "policy", "usage", "meter", "--since", "1h")
    assert r.returncode == 0, r.stderr
    assert "requests        7 (1 errors)" in r.stdout and f"in {sent} (" in r.stdout and f"out {received} (" in r.stdout
    assert re.search(r"worker-seconds  cpu \d+\.\d s", r.stdout)
    r = seq_cli(gw, "policy", "usage", "meter", "--since", "yesterday")
    assert r.returncode == 5 and "is not a duration or a date" in r.stderr

    out = subprocess.run([sys.executable, "-c", "import json, sequence_ai; print(json.dumps(sequence_ai.account()))"],
                         capture_output=True, text=True, env=_env(gw.env()), timeout=60)
    acct = json.loads(out.stdout)
    mine = acct["usage"]["deployments"]["meter"]
    assert mine["total"]["requests"] == 7 and mine["today"]["bytes_in"] == sent and mine["total"]["worker_s"]["cpu"] > 0
    r = seq_cli(gw, "account")
    assert r.returncode == 0 and "usage       meter: cpu " in r.stdout and f"7 requests (1 errors), {sent} B in" in r.stdout


# ------------------------------------------------------------------ limits

def test_limits_refuse_new_connects_and_builds_naming_the_limit_and_never_cut_an_open_session(ops_gateway):
    gw = ops_gateway
    assert gw.deploy(OPS, "qa")["status"] == "ready"
    assert seq_cli(gw, "policy", "scale", "qa", "--min", "1").returncode == 0    # warm: no 2 s idle-out
    conn = gw.connect_ready("qa")
    r = seq_cli(gw, "account", "limits", "--workers", "1")
    assert r.returncode == 0 and "account      workers 1/1" in r.stdout, r.stdout

    r = gw.client.post("/v1/deployments", json={"name": "qb", "file": OPS})        # a build would start a 2nd worker
    body = r.json()
    assert r.status_code == 402 and body["code"] == "quota_exceeded", body
    assert body["details"]["limit"] == "max_workers" and body["details"]["scope"] == "account"
    assert "limit of 1 concurrent workers (max_workers) is reached" in body["detail"]
    assert gw.client.get("/v1/deployments/qb").status_code == 404
    assert gw.connect("qa").status_code == 200                                      # its worker runs already

    robot = gw.client.post("/v1/keys", json={"name": "arm", "deployment": "qa"}).json()
    r = seq_cli(gw, "account", "limits", "--worker-hours", "0.00001", "--key", "arm")   # 36 ms a day
    assert r.returncode == 0 and f"key:{robot['id']}" in r.stdout
    # the running worker's seconds pass the 36 ms within a second or so
    r = eventually(lambda: (lambda r: r if r.status_code != 200 else None)(
        httpx.post(gw.url + "/v1/connect", json={"model": "qa"}, headers={"Authorization": f"Bearer {robot['key']}"})),
        30, 0.1, what="the robot key's connect to be refused past its worker-hours")
    body = r.json()
    assert r.status_code == 402 and body["details"]["limit"] == "worker_hours_per_day", body
    assert body["details"]["scope"] == f"key:{robot['id']}" and "worker-hours per day" in body["detail"]
    assert gw.connect("qa").status_code == 200                                      # the account has no such limit

    r = seq_cli(gw, "account", "limits", "--worker-hours", "0.00001")
    assert r.returncode == 0
    r = gw.connect("qa")
    assert r.status_code == 402 and r.json()["details"]["limit"] == "worker_hours_per_day"
    # the session opened before keeps acting and renewing its lease
    assert _act(conn, {"op": "echo"}).status_code == 200
    renew = gw.client.post(f"/v1/sessions/{conn['session_id']}/renew")
    assert renew.status_code == 200, renew.text
    assert _act({**conn, "direct_secret": renew.json()["direct_secret"]}, {"op": "echo"}).status_code == 200

    r = seq_cli(gw, "account", "limits", "--clear", "all")
    assert r.returncode == 0
    assert gw.connect("qa").status_code == 200
    r = seq_cli(gw, "account", "limits", "--workers", "-1")
    assert r.returncode == 5 and "--workers -1 is negative" in r.stderr


# ------------------------------------------------------------------ alerts

class _Receiver:
    """A real HTTP server on loopback that verifies each delivery's signature with the webhook's
    secret (alerts.verify_signature) and answers 401 to one that fails; the first ``test`` event
    is answered 503 so the sender has to retry."""

    def __init__(self):
        self.secret = ""
        self.got: list[dict] = []
        self.failed_test = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ts, sig = self.headers.get("X-Seq-Timestamp"), self.headers.get("X-Seq-Signature")
                ok = verify_signature(outer.secret, ts, body, sig)
                event = self.headers.get("X-Seq-Event")
                status = 200 if ok else 401
                if ok and event == "test" and not outer.failed_test:
                    outer.failed_test, status = True, 503
                outer.got.append({"event": event, "verified": ok, "status": status, "ts": ts, "sig": sig,
                                  "body": body, "json": json.loads(body) if ok else None})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, name=None):
        return [g["json"] for g in self.got if g["verified"] and (name is None or g["event"] == name)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_alerts_are_signed_retried_and_verified_by_a_real_receiver(tmp_path):
    # a gateway of its own: an alert is sent once a minute per (scope, limit) and gateway, and the
    # limits test's quota_reached would hold back this test's
    gw = GatewayProcess.start(tmp_path, env={"SEQ_HEALTH_INTERVAL_S": "0.3", "SEQ_ALERT_BACKOFF_S": "0.2,0.2,0.2,0.2"})
    rx = _Receiver()
    try:
        r = seq_cli(gw, "alerts", "add", rx.url, "--error-rate", "0.3", "--p95-ms", "0", "--min-requests", "5")
        assert r.returncode == 0, r.stderr
        hook_id = re.search(r"added (wh_\w+)", r.stdout).group(1)
        rx.secret = re.search(r"secret (whsec_\S+)", r.stdout).group(1)
        assert rx.secret not in gw.client.get("/v1/alerts").text                    # shown once

        r = seq_cli(gw, "alerts", "test", hook_id)
        assert r.returncode == 0 and "200 after 2 attempt(s)" in r.stdout, (r.stdout, r.stderr)
        tests = [g for g in rx.got if g["event"] == "test"]
        assert [(g["verified"], g["status"]) for g in tests] == [(True, 503), (True, 200)]

        # a replay: the delivered body and signature with another timestamp does not verify
        first = tests[1]
        old = str(int(first["ts"]) - 600)
        r = httpx.post(rx.url, content=first["body"], headers={"X-Seq-Timestamp": old, "X-Seq-Signature": first["sig"],
                                                               "X-Seq-Event": "test"})
        assert r.status_code == 401
        assert not verify_signature(rx.secret, first["ts"], first["body"], first["sig"], now=int(first["ts"]) + 301)

        assert gw.deploy(BROKEN, "albad")["status"] == "failed"                     # build failed
        ev = eventually(lambda: rx.events("build_failed"), 30, 0.1, what="a build_failed alert")[0]
        assert ev["deployment"] == "albad" and "checkpoint missing" in ev["details"]["error"]

        assert gw.deploy(OPS, "al")["status"] == "ready"
        assert seq_cli(gw, "policy", "scale", "al", "--min", "1").returncode == 0   # warm: no 2 s idle-out
        conn = gw.connect_ready("al")
        codes = [_act(conn, {"op": op}).status_code for op in ("echo", "echo", "echo", "fail", "fail")]
        assert codes == [200, 200, 200, 500, 500]
        rate = eventually(lambda: rx.events("error_rate"), 30, 0.1, what="a error_rate alert")[0]
        assert rate["deployment"] == "al" and rate["details"]["error_rate"] == 0.4 and rate["details"]["threshold"] == 0.3
        # p95 is over its threshold (0 ms) from the first request on: it waits for --min-requests 5
        # (the gateway's once-a-second check may fall between any two of the five requests)
        p95 = eventually(lambda: rx.events("p95_latency"), 30, 0.1, what="a p95_latency alert")[0]
        assert p95["details"]["p95_ms"] > 0 and p95["details"]["requests"] == 5

        pid = gw.status("al")["pid"]
        os.kill(pid, signal.SIGKILL)                                                # worker crashed
        crash = eventually(lambda: rx.events("worker_crashed"), 30, 0.1, what="a worker_crashed alert")[0]
        assert crash["deployment"] == "al" and crash["details"]["exit_code"] == -9

        assert seq_cli(gw, "account", "limits", "--worker-hours", "0.00001").returncode == 0
        r = eventually(lambda: (lambda r: r if r.status_code != 200 else None)(gw.connect("al")), 30, 0.1,
                       what="a connect to be refused past the account's worker-hours")
        assert r.status_code == 402, r.text
        quota = eventually(lambda: rx.events("quota_reached"), 30, 0.1, what="a quota_reached alert")[0]
        assert quota["deployment"] == "al" and quota["details"]["limit"] == "worker_hours_per_day"

        assert all(g["verified"] for g in rx.got if g["body"] is not None and g["ts"] != old)
        r = seq_cli(gw, "alerts", "ls")
        assert r.returncode == 0 and hook_id in r.stdout and "quota_reached" in r.stdout and "delivered (200)" in r.stdout
        assert seq_cli(gw, "alerts", "rm", hook_id).returncode == 0
        assert "no webhooks" in seq_cli(gw, "alerts", "ls").stdout
        r = seq_cli(gw, "alerts", "add", "ftp://example.com")
        assert r.returncode == 5 and "is not an http(s) URL" in r.stderr
    finally:
        rx.close()
        gw.close()


# ------------------------------------------------------------------ cards

def test_seq_gpus_lists_this_machine_and_a_card_it_lacks_is_refused_at_deploy(ops_gateway):
    gw = ops_gateway
    g = gw.client.get("/v1/gpus").json()
    assert g["source"] == "cpu" and g["cards"] == [] and g["cpu"]["cores"] == os.cpu_count()

    d = gw.deploy(H100, "big")
    assert d["status"] == "failed", d
    assert "gpu='H100:2' asks for H100:2, which this machine does not have; it has no GPU (a CPU machine" in d["error"]
    assert d["details"]["reason"] == "gpu_unavailable"
    r = gw.connect("big")
    assert r.status_code == 503 and r.json()["code"] == "worker_failed" and "H100:2" in r.json()["detail"]

    assert gw.deploy(ECHO_POLICY, "small")["status"] == "ready"      # no gpu=: runs on the CPU
    r = seq_cli(gw, "gpus")
    assert r.returncode == 0, r.stderr
    assert "source      cpu" in r.stdout and f"cpu         {os.cpu_count()} cores" in r.stdout
    assert 'cards       none: gpu="cpu"' in r.stdout and "held        small: 1 worker(s), no card" in r.stdout
    assert "big" not in r.stdout


def test_a_limit_refusal_names_the_limit_its_scope_and_what_is_used():
    from sequence_ai_server.ops.quotas import Limits, refusal
    cards = Limits("key:key_7", max_cards=2)
    err = refusal(cards, action="connect", model="pi", starts_worker=True, workers=1, cards=2, new_cards=1,
                  worker_hours_today=0.0)
    assert err.code == "quota_exceeded" and err.status == 402
    assert err.details == {"reason": "quota_reached", "limit": "max_cards", "scope": "key:key_7", "value": 2,
                           "used": 2, "action": "connect", "deployment": "pi"}
    assert "key key_7's limit of 2 cards (max_cards) is reached" in err.detail and "--cards N --key key_7" in err.hint
    # a connect to a worker that already runs starts nothing: workers and cards are not in the way
    assert refusal(cards, action="connect", model="pi", starts_worker=False, workers=1, cards=2, new_cards=1,
                   worker_hours_today=0.0) is None
    assert refusal(cards, action="build", model="pi", starts_worker=True, workers=1, cards=1, new_cards=1,
                   worker_hours_today=0.0) is None                              # 1 + 1 fits in 2
    hours = Limits("account", worker_hours_per_day=8.0)
    err = refusal(hours, action="build", model="pi", starts_worker=True, workers=0, cards=0, new_cards=0,
                  worker_hours_today=8.0)
    assert err.details["limit"] == "worker_hours_per_day" and "cannot build a new version" in err.detail


def test_the_last_hours_p95_is_the_nearest_rank_and_old_samples_leave_the_window():
    from sequence_ai_server.ops.usage import Recent
    rec = Recent(window_s=3600.0)
    rec.add("p", [[i, float(i), int(i > 18)] for i in range(1, 21)], now=1000.0)   # 1..20 ms, two errors
    s = rec.stats("p", now=1000.0)
    assert s == {"requests": 20, "errors": 2, "error_rate": 0.1, "p95_ms": 19.0}
    rec.add("p", [[21, 500.0, 0]], now=1000.0 + 3601.0)
    assert rec.stats("p", now=1000.0 + 3601.0) == {"requests": 1, "errors": 0, "error_rate": 0.0, "p95_ms": 500.0}
    assert rec.stats("q", now=0.0)["p95_ms"] is None
