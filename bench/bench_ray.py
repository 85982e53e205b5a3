"""Robot-path overhead with workers on Ray vs local subprocesses, and worker cold start on Ray.

    python bench/bench_ray.py [--requests 200] [--cold 3]

Starts a loopback Ray head (stopped by PID at the end) and two gateways on 127.0.0.1, one with
``SEQ_BACKEND=ray``; deploys the echo test policy on both; then, through the normal client,
times ``predict()`` (connect once, every request straight to the worker) A/B interleaved and
prints p50/p99 per backend and the Ray/local ratio; then times stop -> first successful
connect (503 + Retry-After until the worker is ready) on both backends.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "test"), str(ROOT), str(ROOT / "server")]

import psutil  # noqa: E402

from _core_support import ECHO, connect, observation  # noqa: E402
from _servers import GatewayProcess  # noqa: E402


def start_head() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="/tmp/rayb")
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "server"), os.environ.get("PYTHONPATH", "")]))
    log = Path(temp) / "head.log"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                             "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=4", "--num-gpus=0",
                             "--object-store-memory=100000000", "--include-dashboard=false",
                             "--disable-usage-stats", f"--temp-dir={temp}"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while "Ray runtime started" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(log.read_text()[-3000:])
        time.sleep(0.2)
    return proc, f"127.0.0.1:{port}"


def stop_head(proc: subprocess.Popen) -> None:
    tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2 if sig == signal.SIGTERM else 0)
    proc.wait(timeout=10)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--cold", type=int, default=3)
    args = ap.parse_args()
    head, address = start_head()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    for sub in ("local", "ray"):
        (tmp / sub).mkdir()
    gws = {}
    try:
        gws["local"] = GatewayProcess.start(tmp / "local")
        gws["ray"] = GatewayProcess.start(tmp / "ray", env={"SEQ_BACKEND": "ray", "SEQ_RAY_ADDRESS": address}, timeout=90)
        for gw in gws.values():
            gw.deploy(ECHO, "echo", wait=True, timeout=90)
        policies = {k: connect(gw, "echo").__enter__() for k, gw in gws.items()}
        obs = observation()
        times: dict[str, list[float]] = {"local": [], "ray": []}
        for k in policies:                                    # warm both paths
            for _ in range(10):
                policies[k].predict(obs)
        for i in range(args.requests):                        # A/B interleaved, order alternating
            for k in (("local", "ray") if i % 2 == 0 else ("ray", "local")):
                t0 = time.perf_counter()
                policies[k].predict(obs)
                times[k].append((time.perf_counter() - t0) * 1000)
        for p in policies.values():
            p.__exit__(None, None, None)
        print(f"robot path, predict() through the client, {args.requests} requests each, interleaved:")
        for k, xs in times.items():
            print(f"  {k:5s}  p50 {statistics.median(xs):6.2f} ms   p99 {pct(xs, 0.99):6.2f} ms")
        print(f"  ratio ray/local  p50 {statistics.median(times['ray']) / statistics.median(times['local']):.2f}x"
              f"   p99 {pct(times['ray'], 0.99) / pct(times['local'], 0.99):.2f}x")
        print(f"worker cold start (stop -> first 200 connect), {args.cold} runs each:")
        for k, gw in gws.items():
            cold = []
            for _ in range(args.cold):
                gw.stop("echo")
                t0 = time.perf_counter()
                gw.connect_ready("echo", timeout=120)
                cold.append(time.perf_counter() - t0)
            print(f"  {k:5s}  median {statistics.median(cold):5.2f} s   (all: {', '.join(f'{c:.2f}' for c in cold)})")
    finally:
        for gw in gws.values():
            gw.close()
        stop_head(head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
