"""Robot-path overhead with workers on Ray vs local subprocesses, worker cold start on Ray,
and robots per worker at 15 Hz without underrun.

    python bench/bench_ray.py [--requests 200] [--cold 3] [--robots 1,2,4,8,16] [--robot-s 6]
                              [--latency-ms 10] [--no-group]

Starts a loopback Ray head and a second node (stopped by PID at the end) and two gateways on 127.0.0.1, one with
``SEQ_BACKEND=ray``; deploys the echo test policy on both; then, through the normal client,

1. times ``predict()`` (connect once, every request straight to the worker) A/B interleaved
   and prints p50/p99 per backend and the Ray/local ratio;
2. times stop -> first successful connect (503 + Retry-After until the worker is ready);
3. deploys a copy of the echo policy with one slot per robot (``@seq.concurrent``) whose infer
   sleeps ``--latency-ms`` (a stand-in model), and drives R robots at once (asyncio client, one
   event loop, 15 Hz, chunks of 10 replanned after 8) for ``--robot-s`` seconds for each R in
   ``--robots`` (after one unmeasured second with every slot busy); prints the actions and
   underruns at each R and the largest R up to which no run had one, per backend;
4. (unless ``--no-group``) deploys test/policies/group_policy.py as a two-member group across
   the head and a second loopback node and times ``/act`` through the group's fan-out front
   against the same fan-out done by the caller (both members at once), interleaved.

Everything shares this machine's cores (the robots' client too), so the robot count is a
floor for a worker on its own machine.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
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

import sequence_ai  # noqa: E402
from _core_support import ECHO, connect, observation  # noqa: E402
from _servers import GatewayProcess  # noqa: E402

GROUP = str(ROOT / "test" / "policies" / "group_policy.py")
RAY_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}   # this run's cluster's own


def _ray_start(args: list, log: Path, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--block", "--node-ip-address=127.0.0.1",
                             "--disable-usage-stats", *args],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 90
    while "Ray runtime started" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(log.read_text()[-3000:])
        time.sleep(0.2)
    return proc


def start_cluster(group: bool) -> tuple[list, str]:
    """A loopback Ray head (and, for ``group``, a second node; one logical GPU each so a
    ``gpu="L4:2"`` policy spans both). Returns (processes, GCS address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="/tmp/rayb")
    # token auth with a token of our own: independent of ~/.ray/auth_token (which a local
    # ray.init() writes and a later `ray start` would pick up)
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", **RAY_AUTH,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "server"), os.environ.get("PYTHONPATH", "")]))
    gpus = "1" if group else "0"
    procs = [_ray_start(["--head", f"--port={port}", "--num-cpus=4", f"--num-gpus={gpus}",
                         "--object-store-memory=100000000", "--include-dashboard=false", f"--temp-dir={temp}"],
                        Path(temp) / "head.log", env)]
    if group:       # a joining node needs Ray's multi-node mode on; it is still pinned to 127.0.0.1
        procs.append(_ray_start([f"--address=127.0.0.1:{port}", "--num-cpus=2", "--num-gpus=1",
                                 "--object-store-memory=80000000"], Path(temp) / "node2.log",
                                dict(env, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1")))
    return procs, f"127.0.0.1:{port}"


def stop_cluster(procs: list) -> None:
    """SIGTERM then SIGKILL every process of every node, by PID."""
    tree = []
    for proc in procs:
        tree.append(proc.pid)
        with contextlib.suppress(psutil.NoSuchProcess):
            tree += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2 if sig == signal.SIGTERM else 0)
    for proc in procs:
        proc.wait(timeout=10)


async def group_overhead(gw: GatewayProcess, requests: int) -> dict:
    """The group policy's /act through the fan-out front vs the same fan-out done by the caller
    (both members at once, rank 0's answer), interleaved; -> {"front": [ms], "direct": [ms]}."""
    import httpx
    gw.deploy(GROUP, "group", wait=True, timeout=180)
    lease = gw.connect_ready("group", timeout=120)
    members = [m["url"] for m in json.loads(sorted((gw.data_dir / "run").glob("group.*.ready.json"),
                                                   key=lambda p: p.stat().st_mtime)[-1].read_text())["group"]]
    headers = {"Authorization": f"Bearer {lease['direct_secret']}"}
    body = {"observation": {"n": 1}}
    out: dict = {"front": [], "direct": []}
    async with httpx.AsyncClient(headers=headers, timeout=60) as client:
        async def front() -> None:
            r = await client.post(lease["worker_url"] + "/act", json=body)
            assert r.status_code == 200 and r.json()["outputs"]["sum"] == 3, r.text

        async def direct() -> None:
            rs = await asyncio.gather(*(client.post(u + "/act", json=body) for u in members))
            assert rs[0].status_code == 200 and rs[0].json()["outputs"]["sum"] == 3, rs[0].text
        for _ in range(10):
            await front()
            await direct()
        for i in range(requests):
            for k, fn in ((("front", front), ("direct", direct)) if i % 2 == 0 else (("direct", direct), ("front", front))):
                t0 = time.perf_counter()
                await fn()
                out[k].append((time.perf_counter() - t0) * 1000)
    gw.stop("group")
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def slots_copy(tmp: Path, slots: int) -> str:
    """The echo policy with ``slots`` model copies in its worker (one robot each)."""
    src = Path(ECHO).read_text()
    marker = "class EchoPolicy(seq.Policy):"
    assert marker in src
    path = tmp / "echo_slots_policy.py"
    path.write_text(src.replace(marker, f"@seq.concurrent(replicas_per_gpu={slots})\n{marker}"))
    return str(path)


async def drive_robots(gw: GatewayProcess, name: str, robots: int, seconds: float, latency_ms: float) -> list:
    """``robots`` concurrent control loops at 15 Hz for ``seconds``; returns their RunOutcomes."""
    obs = observation()

    async def one() -> object:
        async with sequence_ai.aconnect(name, api_key=gw.api_key, gateway_url=gw.url,
                                        params={"chunk_len": 10, "horizon": 8, "latency_ms": latency_ms}) as p:
            return await p.run(lambda: obs, lambda row: None, max_actions=int(15 * seconds), progress=False,
                               validate=lambda row: True)
    return await asyncio.gather(*(one() for _ in range(robots)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--robots", default="1,2,4,8,16", help="robot counts to try, ascending")
    ap.add_argument("--robot-s", type=float, default=6.0, help="seconds each robot runs per step")
    ap.add_argument("--latency-ms", type=float, default=10.0, help="infer time of the stand-in model")
    ap.add_argument("--no-group", action="store_true", help="skip the two-member group (needs torch)")
    args = ap.parse_args()
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    procs, address = start_cluster(group=not args.no_group)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    for sub in ("local", "ray"):
        (tmp / sub).mkdir()
    gws = {}
    try:
        gws["local"] = GatewayProcess.start(tmp / "local")
        gws["ray"] = GatewayProcess.start(tmp / "ray", env={"SEQ_BACKEND": "ray", "SEQ_RAY_ADDRESS": address, **RAY_AUTH,
                                                            "SEQ_RAY_GPUS_PER_NODE": "1",
                                                            "GROUP_EPISODE_LOG": str(tmp / "group-episodes.log")},
                                          timeout=90)
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
        counts = [int(x) for x in args.robots.split(",")]
        slots_file = slots_copy(tmp, max(counts))
        print(f"robots per worker at 15 Hz ({args.robot_s:g} s each, infer {args.latency_ms:g} ms, "
              f"{max(counts)} slots):")
        for gw in gws.values():          # deploy only: a connect here would hold one of the slots
            gw.deploy(slots_file, "slots", wait=True, timeout=120)
            asyncio.run(drive_robots(gw, "slots", max(counts), 1.0, args.latency_ms))   # warm every slot; not counted
        best, clean = {k: 0 for k in gws}, {k: True for k in gws}
        for n in counts:                 # both backends at each count, back to back
            for k, gw in gws.items():
                outs = asyncio.run(drive_robots(gw, "slots", n, args.robot_s, args.latency_ms))
                under = sum(o.underruns for o in outs)
                done = sum(o.actions for o in outs)
                print(f"  {k:5s}  {n:3d} robots  actions {done:5d}/{n * int(15 * args.robot_s):5d}  underruns {under}")
                clean[k] = clean[k] and not under and done == n * int(15 * args.robot_s)
                best[k] = n if clean[k] else best[k]
        for k, b in best.items():
            print(f"  {k:5s}  most robots with no underrun: {b}" + (" (the most tried)" if b == counts[-1] else ""))
        if not args.no_group:
            g = asyncio.run(group_overhead(gws["ray"], args.requests))
            print(f"two-member group (gloo all_reduce in infer), /act, {args.requests} requests each, interleaved:")
            for k, xs in g.items():
                print(f"  {k:6s}  p50 {statistics.median(xs):6.2f} ms   p99 {pct(xs, 0.99):6.2f} ms")
            print(f"  ratio front/caller fan-out  p50 {statistics.median(g['front']) / statistics.median(g['direct']):.2f}x"
                  f"   p99 {pct(g['front'], 0.99) / pct(g['direct'], 0.99):.2f}x")
        print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    finally:
        for gw in gws.values():
            gw.close()
        stop_cluster(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
