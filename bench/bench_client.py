"""Client benchmarks: what the robot pays per call, whether the arm keeps moving, how fast it stops.

Runs a real gateway and worker on loopback (test/_servers.py) hosting bench/bench_client_policy.py
(two 224x224 cameras + 8 floats in, a 16x8 chunk out, infer does nothing) and prints four tables,
every figure measured in this one run:

  1. per-call latency, a new connection each call vs one reused connection (the spec's table);
  2. round trip and client+server overhead over infer(), p50/p99, bytes per request, client and
     server CPU per request, for our JSON body and our binary body (encode included), beside
     openpi's websocket protocol (bench_client_openpi_baseline.py) when its venv exists;
  3. share of time the arm is moving and underruns vs injected RTT / chunk duration, prefetch on
     vs off (goal: 100 % and 0 underruns while RTT <= 0.8 x chunk);
  4. interrupt-to-hold latency in each state: playing, stalled fetch, warming, reconnecting
     (goal: every sample <= one control period).

    python bench/run_client_benches.py          # or: python bench/bench_client.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "server"), str(ROOT / "test")]

import numpy as np  # noqa: E402

import sequence_ai  # noqa: E402
from _servers import GatewayProcess  # noqa: E402

POLICY = str(Path(__file__).resolve().parent / "bench_client_policy.py")
BASELINE = Path(__file__).resolve().parent / "bench_client_openpi_baseline.py"
BASELINE_PY = ROOT / ".venv" / "openpi-baseline" / "bin" / "python"
RNG = np.random.default_rng(0)


def frames():
    """Two 224x224 camera frames with some structure (JPEG of pure noise would be unrealistic)."""
    y, x = np.mgrid[0:224, 0:224]
    base = np.stack([(x * 255 // 223), (y * 255 // 223), ((x + y) * 255 // 446)], -1).astype(np.uint8)
    noise = RNG.integers(0, 12, base.shape, dtype=np.uint8)
    return {"exterior_1": base + noise, "wrist_left": base[::-1] + noise}


FRAMES = frames()
CONTRACT = {"observation": {"cameras": {v: {"width": 224, "height": 224} for v in FRAMES},
                            "proprio": {"joint_positions": 7, "gripper": 1}}}


def make_obs():
    """What a robot does per request: encode both frames and wrap them with 8 floats."""
    return sequence_ai.observation(CONTRACT, images=FRAMES, joints=[0.1] * 7, gripper=[0.5],
                                   instruction="put the red cube on the green pad")


def pct(samples, q):
    return statistics.quantiles(samples, n=100)[q - 1] if len(samples) > 1 else samples[0]


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- 1

def bench_connection_reuse(gw, model, n):
    obs = make_obs()
    with sequence_ai.connect(model, api_key=gw.api_key, gateway_url=gw.url, body_format="binary") as p:
        p.predict(obs)
        reused = []
        for _ in range(n):
            t0 = time.perf_counter()
            p.predict(obs)
            reused.append((time.perf_counter() - t0) * 1000)
        new = []
        wire = p._engine._wire
        for _ in range(n):
            p._call(wire.aclose_http())
            t0 = time.perf_counter()
            p.predict(obs)
            new.append((time.perf_counter() - t0) * 1000)
    print("\n1. Connection reuse (binary body, 2x224^2 JPEG + 8 floats, per call, ms)")
    print(f"   {'':34}{'p50':>8}{'p99':>8}")
    print(f"   {'new connection each call':34}{statistics.median(new):8.2f}{pct(new, 99):8.2f}")
    print(f"   {'one reused connection':34}{statistics.median(reused):8.2f}{pct(reused, 99):8.2f}")
    print(f"   saved by keeping it open: {statistics.median(new) - statistics.median(reused):.2f} ms "
          f"per call ({statistics.median(new) / statistics.median(reused):.2f}x)")


# --------------------------------------------------------------------------- 2

def bench_overhead(gw, model, n, worker_pid):
    rows = []
    for fmt in ("json", "binary"):
        with sequence_ai.connect(model, api_key=gw.api_key, gateway_url=gw.url, body_format=fmt) as p:
            for _ in range(20):
                p.predict(make_obs())
            rtt, over, enc = [], [], []
            c0, s0 = time.process_time(), proc_cpu_s(worker_pid)
            for _ in range(n):
                t0 = time.perf_counter()
                obs = make_obs()
                t1 = time.perf_counter()
                pred = p.predict(obs)
                t2 = time.perf_counter()
                enc.append((t1 - t0) * 1000)
                rtt.append((t2 - t0) * 1000)
                over.append((t2 - t0) * 1000 - (pred.inference_ms or 0.0))
            client_cpu = (time.process_time() - c0) / n * 1000
            server_cpu = (proc_cpu_s(worker_pid) - s0) / n * 1000
            size = p._engine._wire.last_request_bytes
        rows.append((f"ours, {fmt} body (encode incl.)", statistics.median(rtt), pct(rtt, 99),
                     statistics.median(over), pct(over, 99), size, client_cpu, server_cpu,
                     statistics.median(enc)))
    base = None
    if BASELINE_PY.exists():
        res = subprocess.run([str(BASELINE_PY), str(BASELINE), str(n)], capture_output=True, text=True,
                             timeout=300)
        if res.returncode == 0:
            base = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append(("openpi websocket (raw uint8, msgpack)", base["p50_ms"], base["p99_ms"],
                         base["p50_ms"], base["p99_ms"], base["bytes"], base["client_cpu_ms"],
                         base["server_cpu_ms"], 0.0))
        else:
            print(f"   (openpi baseline failed: {res.stderr.strip().splitlines()[-1:]})")
    print("\n2. Round trip and overhead over infer(), 2x224^2 + 8 floats, trivial policy, loopback")
    print(f"   {'':40}{'rtt p50':>9}{'p99':>8}{'ovh p50':>9}{'p99':>8}{'bytes':>9}"
          f"{'cli cpu':>9}{'srv cpu':>9}{'encode':>8}")
    for r in rows:
        print(f"   {r[0]:40}{r[1]:9.2f}{r[2]:8.2f}{r[3]:9.2f}{r[4]:8.2f}{r[5]:9d}{r[6]:9.2f}{r[7]:9.2f}{r[8]:8.2f}")
    print("   (ms; overhead = round trip - the worker's inference_ms; CPU per request; server CPU of the"
          " worker process, including its HTTP stack)")
    if base:
        print(f"   ratio ours-binary / openpi: round trip p50 {rows[1][1] / base['p50_ms']:.2f}x, "
              f"bytes {rows[1][5] / base['bytes']:.3f}x")
    if not BASELINE_PY.exists():
        print(f"   (openpi baseline not run: {BASELINE_PY} missing; run_client_benches.py creates it)")
    print(f"   bytes per binary request, frames above (gradient + per-pixel noise 0..11): {rows[1][5]}; "
          f"{sim_frames_bytes()}")


def sim_frames_bytes() -> str:
    """Binary /act body size for two 224x224 frames rendered from the pick-place sim (the demo's
    cameras): a second, rendered-scene reference for the bytes goal."""
    try:
        from sequence_ai_sim.panda_sim import PandaPickPlaceSim
        sim = PandaPickPlaceSim(seed=0, image_size=224)
        frames = {"exterior_1": sim.render("exterior_1"), "wrist_left": sim.render("wrist_left")}
    except Exception as exc:  # noqa: BLE001 - the sim extra is optional for this one line
        return f"sim-rendered frames: not measured ({type(exc).__name__}: {exc})"
    obs = sequence_ai.observation(CONTRACT, images=frames, joints=[0.1] * 7, gripper=[0.5],
                                  instruction="put the red cube on the green pad")
    from sequence_ai_core import encode_act_body
    from sequence_ai_core._types import observation_to_wire
    body, _ = encode_act_body({"observation": observation_to_wire(obs, None), "params": {}}, True)
    return f"two 224x224 frames rendered from the pick-place sim (exterior + wrist): {len(body)}"


# --------------------------------------------------------------------------- 3

def bench_prefetch(gw, model, actions):
    hz, horizon = 50.0, 8
    chunk_s = horizon / hz
    print(f"\n3. Arm moving vs injected RTT (chunk = {horizon} rows at {hz:g} Hz = {chunk_s * 1000:.0f} ms),"
          f" {actions} actions per run")
    print(f"   {'injected':>10}{'measured':>10}{'prefetch':>10}{'moving %':>10}{'underruns':>11}{'underrun s':>12}")
    print(f"   {'RTT/chunk':>10}{'RTT/chunk':>10}")
    for ratio in (0.2, 0.5, 0.8, 1.2):
        for prefetch in (True, False):
            latency_ms = ratio * chunk_s * 1000
            with sequence_ai.connect(model, api_key=gw.api_key, gateway_url=gw.url,
                                     params={"latency_ms": latency_ms, "horizon": horizon}) as p:
                out = p.run(make_obs, lambda row: None, max_actions=actions, validate=lambda r: True,
                            prefetch=prefetch, progress=False)
                measured = (p._engine._latency.mean_s or 0.0) / chunk_s
            ideal = out.actions / hz
            moving = 100.0 * ideal / (ideal + out.underrun_s)
            print(f"   {ratio:>10.1f}{measured:>10.2f}{'on' if prefetch else 'off':>10}{moving:>10.1f}{out.underruns:>11d}"
                  f"{out.underrun_s:>12.3f}")


# --------------------------------------------------------------------------- 4

class _Stalled:
    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        for c in self.conns:
            c.close()
        self.sock.close()


def _interrupt_once(gw, model, state, at_s, slow_model=None):
    hz = 50.0
    marks = {}
    stalled = _Stalled() if state == "reconnecting" else None
    params = {"latency_ms": 5000.0} if state == "stalled fetch" else {}
    name = slow_model if state == "warming" else model
    try:
        with sequence_ai.connect(name, api_key=gw.api_key, gateway_url=gw.url, params=params) as p:
            if state == "stalled fetch":
                p._engine._latency.add(0.001)  # a fast history: the stall is a surprise
            wire = p._engine._wire

            def fire():
                if stalled is not None:
                    wire.gateway_url = stalled.url
                    wire.session.direct_secret = "rotated-away"
                    time.sleep(0.3)
                marks["t"] = time.monotonic()
                p.interrupt()

            threading.Timer(at_s, fire).start()
            p.run(make_obs, lambda row: None, max_actions=100000, validate=lambda r: True,
                  hold=lambda: marks.setdefault("hold", time.monotonic()), progress=False,
                  startup_timeout_s=600)
    finally:
        if stalled is not None:
            stalled.close()
    return (marks["hold"] - marks["t"]) * 1000, 1000 / hz


def bench_interrupt(gw, model, slow_model, samples):
    print(f"\n4. Interrupt-to-hold latency (ms; one control period = 20 ms at 50 Hz), {samples} samples each")
    print(f"   {'state':16}{'p50':>8}{'max':>8}{'<= period':>11}")
    plans = {"playing": 0.35, "stalled fetch": 0.6, "warming": 0.8, "reconnecting": 0.4}
    for state, at in plans.items():
        got = []
        for i in range(samples):
            if state == "warming":
                gw.stop(slow_model)  # the next connect cold-starts it
            ms, period = _interrupt_once(gw, model, state, at + 0.013 * i, slow_model)
            got.append(ms)
        ok = sum(g <= period for g in got)
        print(f"   {state:16}{statistics.median(got):8.2f}{max(got):8.2f}{ok:>8d}/{len(got)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    args = ap.parse_args(argv)
    n = 60 if args.quick else 300
    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess.start(Path(tmp))
        try:
            gw.deploy(POLICY, "bench-client", wait=True)
            slow_src = Path(tmp) / "bench_slow_policy.py"
            slow_src.write_text("import os\nos.environ['BENCH_LOAD_S'] = '3'\n" + Path(POLICY).read_text())
            gw.deploy(str(slow_src), "bench-client-slow", wait=True, timeout=120)
            pid = gw.status("bench-client")["pid"]
            print(f"sequence-ai client benchmarks (loopback, {os.cpu_count()} CPUs, "
                  f"python {sys.version.split()[0]}, load average at start "
                  f"{os.getloadavg()[0]:.1f}: other processes share these CPUs)")
            bench_connection_reuse(gw, "bench-client", n // 3)
            bench_overhead(gw, "bench-client", n, pid)
            bench_prefetch(gw, "bench-client", 60 if args.quick else 150)
            bench_interrupt(gw, "bench-client", "bench-client-slow", 3 if args.quick else 8)
        finally:
            gw.close()


if __name__ == "__main__":
    main()
