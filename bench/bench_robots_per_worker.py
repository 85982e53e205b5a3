"""Robots per worker replica: how many synchronized robots one replica serves without underruns.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_robots_per_worker.py \
        [--robots 16,24,32,64] [--seconds 20] [--procs 4] [--latency-ms 5] [--chunk 8] \
        [--baseline DIR ...] [--alternate] [--nice N] [--profile DIR]   # ~4 min; ~7 with --baseline

Starts a real gateway (``python -m sequence_ai_server.gateway``, temp data dir) on loopback and
deploys test/policies/echo_policy.py: one worker, one replica, a trivial policy that sleeps
``--latency-ms`` (5 ms) per inference and answers ``--chunk`` (8) rows at the contract's 15 Hz
(the pick-place rhythm: 8 rows played per chunk, 533 ms). Then, for each N, N robots are
spread over ``--procs`` (4) client processes (multiprocessing, ``spawn``); each process connects
its N/procs robots (``sequence_ai.aconnect``, one asyncio task each), all processes meet at a
barrier, and every robot calls ``run()`` at the same monotonic instant for ``--seconds`` worth
of actions (seconds x 15). observe() hands back one pre-encoded 64x64 observation (the client
side costs no JPEG encoding, so the worker is what is measured); act() does nothing.

Per N it prints: underruns (sum over robots, ``RunOutcome.underruns``), how many came in the
first 2 s, the robots that had any, underrun seconds, late ticks (the client process more than
a period late), p50/p99 fetch latency in ms (``/act`` round trips as the wire saw them, every
request of every robot, the startup one included), the client event loops' lag p50/p99 in ms
(a thread in each client process hands its loop a callback every 5-15 ms while the robots drive
and records how long it waited to run: what an answer arriving, or a robot whose time has come,
waits behind the other robots of its process), and the CPU of the worker and of the client
processes (CPU seconds per wall second over the driving window, /proc/PID/stat utime+stime;
1.0 = one core busy), beside the machine's 1-minute load average.

``--baseline DIR`` compares engines in one run: DIR holds another ``sequence_ai_core`` package
(``git archive <commit> sequence_ai_core | tar -x -C DIR``); each N runs with it ("before")
and then with this checkout's ("now"). Give it more than once to compare several (labelled
``before1``, ``before2`` … in the order given). ``--profile DIR`` runs the first client process
of each fleet under cProfile (builtins included, so a blocking ``time.sleep`` on the event loop
shows as its own row) and writes ``DIR/client_n<N>_<label>.prof``. ``--alternate`` reverses
the engines' order for every other N (``--robots 64,64,64,64 --alternate``: a shared machine's
load drifts through a run, and the engine that runs second is not always the one that meets it).
``--nice -10`` runs the bench with its gateway, worker and client processes at that nice value
(root), in a session of their own (on Linux a scheduler autogroup, given that nice value too;
a nice value alone only orders threads within one session): on a machine shared with other
work, late ticks and the underruns they cause then measure this system, not the CPU the other
work left it. Prints figures; no pass/fail.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "server"))
sys.path.insert(0, str(ROOT))

HZ = 15.0  # the echo policy's contract (and pick-place's) control frequency


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def take_priority(nice: int) -> None:
    """This process, and every process it starts from now on, at ``nice``; on Linux in a
    session of its own, so that it is its own scheduler autogroup, given ``nice`` too.

    With autogroups (the default on desktop and many server kernels) a nice value only orders
    threads within one session; CPU is first shared between sessions, so a session of its own
    with its own weight is what lets the bench's processes get the CPU they need on a machine
    shared with other work. Raises PermissionError below 0 without root/CAP_SYS_NICE.
    """
    try:
        os.setsid()
    except OSError:  # already a session leader
        pass
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:  # no autogroups here: plain nice values decide
        pass
    os.setpriority(os.PRIO_PROCESS, 0, nice)  # threads and processes started later inherit it


def pct(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1))))] if s else float("nan")


# ----------------------------------------------------------------- client process

def _probe_loop_lag(loop, stop, lag_ms: List[float]) -> None:
    """Every 5-15 ms, from a thread: hand the event loop a callback (as an answer arriving does)
    and record how long (ms) the loop took to run it."""
    import random

    rng = random.Random(os.getpid())
    while not stop.is_set():
        time.sleep(rng.uniform(0.005, 0.015))
        sent = time.monotonic()
        try:
            loop.call_soon_threadsafe(lambda s=sent: lag_ms.append((time.monotonic() - s) * 1000.0))
        except RuntimeError:  # the loop closed
            return


async def _robots(args: Dict[str, Any], ready, go, start_at, results) -> None:
    import numpy as np

    import sequence_ai
    import sequence_ai_core

    policies = []
    fetch_ms: List[float] = []
    lag_ms: List[float] = []
    try:
        for _ in range(args["robots"]):
            p = sequence_ai.aconnect("echo", api_key=args["api_key"], gateway_url=args["url"],
                                     params={"chunk_len": args["chunk"], "latency_ms": args["latency_ms"]})
            await p.connect()
            act = p._wire.act

            async def timed(*a, _act=act, **kw):  # the real request, timed
                t0 = time.monotonic()
                try:
                    return await _act(*a, **kw)
                finally:
                    fetch_ms.append((time.monotonic() - t0) * 1000.0)

            p._wire.act = timed
            policies.append(p)
        obs = sequence_ai.observation(policies[0].contract,
                                      images={"exterior_1": np.zeros((64, 64, 3), np.uint8)},
                                      joints=[0.0] * 7, gripper=[0.5],
                                      instruction="put the red cube on the green pad")
        await asyncio.get_running_loop().run_in_executor(None, ready.wait)
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        await asyncio.sleep(max(0.0, start_at.value - time.monotonic()))
        max_actions = int(round(args["seconds"] * HZ))
        t0 = start_at.value
        underrun_at: List[float] = []
        import threading

        stop_probe = threading.Event()
        probe = threading.Thread(target=_probe_loop_lag, daemon=True,
                                 args=(asyncio.get_running_loop(), stop_probe, lag_ms))
        probe.start()
        outs = await asyncio.gather(*(p.run(lambda: obs, lambda row: None, max_actions=max_actions,
                                            validate=lambda row: True, progress=False,
                                            on_underrun=lambda: underrun_at.append(time.monotonic() - t0))
                                     for p in policies),
                                    return_exceptions=True)
        stop_probe.set()
        rows = []
        for out in outs:
            if isinstance(out, BaseException):
                rows.append({"error": f"{type(out).__name__}: {out}"})
            else:
                rows.append({"underruns": out.underruns, "underrun_s": out.underrun_s,
                             "late_ticks": out.late_ticks, "actions": out.actions, "reason": out.reason})
        results.put({"robots": rows, "fetch_ms": fetch_ms, "underrun_at": underrun_at, "lag_ms": lag_ms,
                     "core": str(Path(sequence_ai_core.__file__).resolve().parent.parent)})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which prints it
        results.put({"robots": [], "fetch_ms": fetch_ms, "error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        for p in policies:
            try:
                await p.aclose()
            except Exception:  # noqa: BLE001 - closing is best effort at the end of a bench
                pass


def client_process(args, ready, go, start_at, results) -> None:
    if args["core"]:
        sys.path.insert(0, args["core"])  # before sequence_ai imports sequence_ai_core
    if not args.get("profile"):
        asyncio.run(_robots(args, ready, go, start_at, results))
        return
    import cProfile

    prof = cProfile.Profile()  # builtins included: a blocking time.sleep shows as its own row
    prof.enable()
    try:
        asyncio.run(_robots(args, ready, go, start_at, results))
    finally:
        prof.disable()
        prof.dump_stats(args["profile"])


# ----------------------------------------------------------------- one N

def run_fleet(gw, worker_pid: int, n: int, label: str, core: Optional[str], opts) -> Dict[str, Any]:
    ctx = mp.get_context("spawn")
    procs_n = max(1, min(opts.procs, n))
    shares = [n // procs_n + (1 if i < n % procs_n else 0) for i in range(procs_n)]
    ready, go = ctx.Barrier(procs_n + 1), ctx.Barrier(procs_n + 1)
    start_at = ctx.Value("d", 0.0)
    results = ctx.Queue()
    procs = []
    for i, share in enumerate(shares):
        profile = None
        if opts.profile and i == 0:
            profile = str(Path(opts.profile) / f"client_n{n}_{label}.prof")
        args = {"robots": share, "url": gw.url, "api_key": gw.api_key, "core": core,
                "seconds": opts.seconds, "chunk": opts.chunk, "latency_ms": opts.latency_ms,
                "profile": profile}
        pr = ctx.Process(target=client_process, args=(args, ready, go, start_at, results), daemon=True)
        pr.start()
        procs.append(pr)
    ready.wait(timeout=300)  # every robot connected
    start_at.value = time.monotonic() + 0.5
    go.wait(timeout=60)
    time.sleep(max(0.0, start_at.value - time.monotonic()))
    cpu0, t0 = proc_cpu_s(worker_pid), time.monotonic()
    clients0 = sum(proc_cpu_s(pr.pid) for pr in procs)
    time.sleep(opts.seconds)
    cpu1, t1 = proc_cpu_s(worker_pid), time.monotonic()
    clients1 = sum(proc_cpu_s(pr.pid) for pr in procs)
    load1 = os.getloadavg()[0]
    collected = [results.get(timeout=opts.seconds + 300) for _ in procs]
    for pr in procs:
        pr.join(timeout=30)
    used = {c["core"] for c in collected if "core" in c}
    assert used <= {str(Path(core or ROOT).resolve())}, f"asked for {core or ROOT}, imported {used}"
    robots = [r for c in collected for r in c["robots"]]
    errors = [c["error"] for c in collected if c.get("error")] + [r["error"] for r in robots if "error" in r]
    ok = [r for r in robots if "error" not in r]
    fetch = [ms for c in collected for ms in c["fetch_ms"]]
    at = [s for c in collected for s in c.get("underrun_at", [])]
    lag = [ms for c in collected for ms in c.get("lag_ms", [])]
    return {
        "n": n, "errors": errors, "robots_ok": len(ok),
        "underruns": sum(r["underruns"] for r in ok),
        "robots_with_underruns": sum(1 for r in ok if r["underruns"]),
        "underrun_s": sum(r["underrun_s"] for r in ok),
        "late_ticks": sum(r["late_ticks"] for r in ok),
        "requests": len(fetch), "p50_ms": pct(fetch, 50), "p99_ms": pct(fetch, 99),
        "lag_p50_ms": pct(lag, 50), "lag_p99_ms": pct(lag, 99),
        "worker_cpu": (cpu1 - cpu0) / (t1 - t0), "clients_cpu": (clients1 - clients0) / (t1 - t0),
        "load1": load1, "underruns_first_2s": sum(1 for s in at if s < 2.0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--robots", default="16,24,32,64", help="comma-separated fleet sizes")
    ap.add_argument("--seconds", type=float, default=20.0, help="driving time per fleet (s)")
    ap.add_argument("--procs", type=int, default=4, help="client processes per fleet")
    ap.add_argument("--baseline", metavar="DIR", action="append", default=[],
                    help="a directory holding an older sequence_ai_core package (e.g. `git archive"
                         " main sequence_ai_core | tar -x -C DIR`): each N runs with it first;"
                         " may be given more than once")
    ap.add_argument("--latency-ms", type=float, default=5.0, help="policy inference time (ms)")
    ap.add_argument("--chunk", type=int, default=8, help="rows per chunk")
    ap.add_argument("--alternate", action="store_true",
                    help="with --baseline: every other N runs the engines in reverse order (repeat an"
                         " N, e.g. --robots 64,64,64,64, to compare on a machine whose load drifts)")
    ap.add_argument("--nice", type=int, default=None,
                    help="run the bench, the gateway, the worker and the client processes at this"
                         " nice value, in a session (scheduler autogroup) of their own at it too"
                         " (below 0 needs root): on a machine shared with other work, the figures"
                         " then describe this system rather than the other load")
    ap.add_argument("--profile", metavar="DIR",
                    help="profile the first client process of each fleet with cProfile and write"
                         " DIR/client_n<N>_<label>.prof (read with `python -m pstats`); the"
                         " profiler slows that process, so read its figures apart")
    opts = ap.parse_args()
    if opts.profile:
        Path(opts.profile).mkdir(parents=True, exist_ok=True)
    if opts.nice is not None:
        take_priority(opts.nice)  # before the gateway, the worker and the clients start
    sizes = [int(x) for x in opts.robots.split(",") if x.strip()]
    labels = ["before"] if len(opts.baseline) == 1 else [f"before{i + 1}" for i in range(len(opts.baseline))]
    cores = [(label, str(Path(d).resolve())) for label, d in zip(labels, opts.baseline)] + [("now", None)]
    for d in opts.baseline:
        if not (Path(d) / "sequence_ai_core" / "__init__.py").is_file():
            ap.error(f"--baseline {d}: no sequence_ai_core/__init__.py in it")
        # this checkout's sequence_ai must import on it, or every client process dies at start
        check = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
                                " import sequence_ai", str(Path(d).resolve())],
                               capture_output=True, text=True, cwd=str(ROOT))
        if check.returncode != 0:
            last = (check.stderr.strip().splitlines() or ["?"])[-1]
            ap.error(f"--baseline {d}: this checkout's sequence_ai does not import on that"
                     f" sequence_ai_core ({last}); take a core from a commit whose API matches")

    from _servers import ECHO_POLICY, GatewayProcess

    print(f"one worker, one replica: echo policy, {opts.latency_ms:g} ms inference, {opts.chunk} rows"
          f" at {HZ:g} Hz ({opts.chunk / HZ * 1000:.0f} ms per chunk); {opts.procs} client processes;"
          f" synchronized start; {opts.seconds:g} s of actions per robot; {os.cpu_count()} CPUs"
          + (f"; gateway, worker and clients at nice {opts.nice}" if opts.nice is not None else ""))
    for label, core in cores:
        print(f"{label}: sequence_ai_core from {core or ROOT}")
    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess.start(Path(tmp))
        try:
            d = gw.deploy(ECHO_POLICY, "echo")
            assert d["status"] == "ready", d
            gw.connect_ready("echo")
            worker_pid = int(gw.status("echo")["pid"])
            header = (f"{'N':>4} {'core':>7} {'underruns':>10} {'<2s':>4} {'robots':>7} {'underrun s':>11}"
                      f" {'late':>5} {'requests':>9} {'p50 ms':>7} {'p99 ms':>7} {'lag p50':>8} {'lag p99':>8}"
                      f" {'worker CPU':>11}"
                      f" {'client CPU':>11} {'load1':>6}")
            print(header)
            for i, n in enumerate(sizes):
                # --alternate: every other N runs "now" first, so a load that rises or falls
                # through the run does not always favour the same engine
                for label, core in (cores[::-1] if opts.alternate and i % 2 else cores):
                    r = run_fleet(gw, worker_pid, n, label, core, opts)
                    print(f"{n:>4} {label:>7} {r['underruns']:>10d} {r['underruns_first_2s']:>4d}"
                          f" {r['robots_with_underruns']:>7d} {r['underrun_s']:>11.3f} {r['late_ticks']:>5d}"
                          f" {r['requests']:>9d} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f}"
                          f" {r['lag_p50_ms']:>8.2f} {r['lag_p99_ms']:>8.2f}"
                          f" {r['worker_cpu']:>11.2f} {r['clients_cpu']:>11.2f} {r['load1']:>6.2f}", flush=True)
                    for e in r["errors"][:3]:
                        print(f"     error: {e}")
            print("(underruns: sum over robots; <2s: of those, in the first 2 s after the synchronized"
                  " start; robots: how many had any; late: ticks more than a period late (the client"
                  " process starved); p50/p99 ms: /act round trips; lag p50/p99: ms a callback handed"
                  " to a client event loop from outside waited to run (sampled every 5-15 ms"
                  " while driving, all client processes); worker / client CPU: CPU s per wall s, the clients summed)")
        finally:
            gw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
