"""Fleet serving: how many robots one replica of a GPU-like policy serves at their deadlines.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_fleet.py \
        [--robots 1,2,4,8,16,32,64,96] [--seconds 20] [--procs 2] [--variants serial,fifo,edf] \
        [--mixed 24] [--base-ms 40] [--item-ms 2] [--max-batch 16]

The policy costs like a GPU model: one ``infer`` call sleeps ``--base-ms`` (40) + ``--item-ms``
(2) per batch item, with the GIL released (``time.sleep``), so the worker's CPU is what the
server itself spends. Its chunk is 8 rows at the contract's 15 Hz: each robot needs a chunk
every 533 ms. Starts a real gateway (``python -m sequence_ai_server.gateway``, temp data dir)
on loopback and deploys the variants side by side, one worker and one replica each (idle
while another variant drives; at each N the variants take turns, so they meet the same load):

* ``serial`` -- one request at a time (no ``@seq.batched``), first come first served;
* ``fifo``   -- ``@seq.batched(max_batch_size=16)``; the clients send no deadline (as before
  deadlines existed: the replica serves first come first served, batches what waits);
* ``edf``    -- the same policy; the clients send their deadline (``deadline_ms``: the
  playback left less the network round trip), so the replica serves earliest deadline first
  and a batch waits for more only while its earliest deadline allows the predicted batch time.

For each N, N robots are spread over ``--procs`` (2) client processes, each robot an asyncio
task with the real client (``sequence_ai.aconnect``; connect through the gateway, then /act to
the worker on the /act channel); all start at one monotonic instant and drive ``--seconds`` of
wall time (``until``: the same window for every robot, underrunning or not). observe() hands
back one pre-built observation (7 joint values, no camera: the client costs no encoding);
act() does nothing. A robot whose connect is refused
or queued is counted and does not drive.

Per N: underruns (sum over robots), robots with any, robots refused or queued at connect,
per-robot p50 / p99 round trip (each robot's own p50 and p99 of its /act round trips, then the
median of those and the worst), requests/s (answers per wall second, all robots), mean batch
size (the worker's answers' ``batch_size``), late (edf: answers the worker marked past the
deadline the request claimed, of the answers to requests that claimed one), dl p50 (edf: the
median deadline_ms claimed), the worker's and the clients' CPU (CPU s per wall s,
/proc/PID/stat; 1.0 = one core busy) and the 1-minute load average.

``--mixed N`` adds the mixed-rate case on one replica: N/2 robots needing a chunk every 540 ms
(27 rows at 50 Hz, the 15 Hz rhythm) and N/2 every 160 ms (8 rows at 50 Hz), fifo against edf,
reported per group. Prints figures; no pass/fail.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "server"))
sys.path.insert(0, str(ROOT))

POLICY = '''
import time
import numpy as np
import seq

BASE_S, ITEM_S = {base_ms} / 1000.0, {item_ms} / 1000.0


@seq.policy(gpu="cpu", max_gpus=1, on_full="reject",
            action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=7,
                                      control_frequency_hz={hz}, bounds=[(-10.0, 10.0)] * 7),
            observation=seq.ObservationContract(proprio={{"joint_positions": 7}}))
class FleetCost(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass
{decorator}
    @seq.infer
    def infer(self, obs, *, chunk_len: int = 8):
        batch = obs if isinstance(obs, list) else [obs]
        time.sleep(BASE_S + ITEM_S * len(batch))        # a GPU call: the GIL is released
        lens = chunk_len if isinstance(chunk_len, list) else [chunk_len]
        chunks = [seq.ActionChunk(np.tile(np.asarray(o.joint_positions, dtype=float), (n, 1)))
                  for o, n in zip(batch, lens)]
        return chunks if isinstance(obs, list) else chunks[0]
'''


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1))))] if s else float("nan")


# ----------------------------------------------------------------- client process

async def _robots(args: Dict[str, Any], ready, go, start_at, results) -> None:
    import sequence_ai

    robots: List[Dict[str, Any]] = []
    refused = 0
    try:
        for chunk_len in args["chunks"]:
            p = sequence_ai.aconnect(args["model"], api_key=args["api_key"], gateway_url=args["url"],
                                     params={"chunk_len": chunk_len})
            try:
                await asyncio.wait_for(p.connect(), timeout=30)
            except Exception:  # noqa: BLE001 - refused (deployment_full) or queued past 30 s: counted
                refused += 1
                try:
                    await p.aclose()
                except Exception:  # noqa: BLE001
                    pass
                continue
            rec: Dict[str, Any] = {"chunk": chunk_len, "rtt_ms": [], "batch": [], "late": 0, "deadline_ms": []}
            if not args["deadlines"]:   # fifo: this client sends no deadline (as before deadlines)
                p._wire.deadlines.fields = lambda left, intervals: {}
            else:                       # edf: note the deadline each request claims
                def fields(left, intervals, _f=p._wire.deadlines.fields, _rec=rec):
                    out = _f(left, intervals)
                    _rec["deadline_ms"].append(out["deadline_ms"])
                    return out
                p._wire.deadlines.fields = fields
            act = p._wire.act

            async def timed(*a, _act=act, _rec=rec, **kw):  # the real request, timed
                t0 = time.monotonic()
                pred = await _act(*a, **kw)
                _rec["rtt_ms"].append((time.monotonic() - t0) * 1000.0)
                _rec["batch"].append(pred.extra.get("batch_size", 1))
                _rec["late"] += bool(pred.extra.get("late"))
                return pred

            p._wire.act = timed
            rec["policy"] = p
            robots.append(rec)
        await asyncio.get_running_loop().run_in_executor(None, ready.wait)
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        await asyncio.sleep(max(0.0, start_at.value - time.monotonic()))
        obs = sequence_ai.observation(robots[0]["policy"].contract, images={}, joints=[0.0] * 7,
                                      instruction="sort the parts") if robots else None
        end_at = start_at.value + args["seconds"]          # every robot drives the same wall window
        outs = await asyncio.gather(*(r["policy"].run(lambda: obs, lambda row: None,
                                                      max_actions=int(args["seconds"] * args["hz"] * 4),
                                                      until=lambda: time.monotonic() >= end_at,
                                                      validate=lambda row: True, progress=False)
                                      for r in robots), return_exceptions=True)
        rows = []
        for r, out in zip(robots, outs):
            row = {k: r[k] for k in ("chunk", "rtt_ms", "batch", "late", "deadline_ms")}
            if isinstance(out, BaseException):
                row["error"] = f"{type(out).__name__}: {out}"
            else:
                row["underruns"] = out.underruns
            rows.append(row)
        results.put({"robots": rows, "refused": refused})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which prints it
        results.put({"robots": [], "refused": refused, "error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        for r in robots:
            try:
                await r["policy"].aclose()
            except Exception:  # noqa: BLE001 - closing is best effort at the end of a bench
                pass


def client_process(args, ready, go, start_at, results) -> None:
    asyncio.run(_robots(args, ready, go, start_at, results))


# ----------------------------------------------------------------- one fleet

WORKER_URLS: Dict[str, str] = {}


def _ping(gw, model: str) -> Dict[str, Any]:
    import httpx

    return httpx.get(f"{WORKER_URLS[model]}/ping", timeout=10).json()


def run_fleet(gw, model: str, worker_pid: int, chunks: List[int], deadlines: bool, opts,
              hz: float = 15.0) -> Dict[str, Any]:
    ctx = mp.get_context("spawn")
    n = len(chunks)
    procs_n = max(1, min(opts.procs, n))
    shares = [chunks[i::procs_n] for i in range(procs_n)]
    ready, go = ctx.Barrier(procs_n + 1), ctx.Barrier(procs_n + 1)
    start_at = ctx.Value("d", 0.0)
    results = ctx.Queue()
    procs = []
    for share in shares:
        args = {"chunks": share, "url": gw.url, "api_key": gw.api_key, "model": model,
                "seconds": opts.seconds, "deadlines": deadlines, "hz": hz}
        pr = ctx.Process(target=client_process, args=(args, ready, go, start_at, results), daemon=True)
        pr.start()
        procs.append(pr)
    ready.wait(timeout=600)  # every robot connected (or refused)
    start_at.value = time.monotonic() + 0.5
    late0 = _late(gw, model)
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
        pr.join(timeout=60)
    late1 = _late(gw, model)
    robots = [r for c in collected for r in c["robots"]]
    errors = [c["error"] for c in collected if c.get("error")] + [r["error"] for r in robots if "error" in r]
    return {"n": n, "robots": robots, "errors": errors, "refused": sum(c["refused"] for c in collected),
            "late": late1[1] - late0[1], "with_deadline": late1[0] - late0[0],
            "worker_cpu": (cpu1 - cpu0) / (t1 - t0), "clients_cpu": (clients1 - clients0) / (t1 - t0),
            "wall_s": t1 - t0, "load1": load1}


def _late(gw, model: str) -> tuple:
    try:
        d = _ping(gw, model).get("deadlines") or {}
        return d.get("requests", 0), d.get("late", 0)
    except Exception:  # noqa: BLE001 - a figure, not a check
        return 0, 0


def summarize(r: Dict[str, Any], robots: List[Dict[str, Any]]) -> Dict[str, Any]:
    ok = [x for x in robots if "error" not in x]
    p50s = [pct(x["rtt_ms"], 50) for x in ok if x["rtt_ms"]]
    p99s = [pct(x["rtt_ms"], 99) for x in ok if x["rtt_ms"]]
    batches = [b for x in ok for b in x["batch"]]
    answers = sum(len(x["rtt_ms"]) for x in ok)
    claimed = [d for x in ok for d in x["deadline_ms"]]
    return {"robots": len(ok), "underruns": sum(x["underruns"] for x in ok),
            "late": sum(x["late"] for x in ok), "claimed": len(claimed),
            "deadline_p50": statistics.median(claimed) if claimed else float("nan"),
            "with_underruns": sum(1 for x in ok if x["underruns"]),
            "p50": statistics.median(p50s) if p50s else float("nan"), "p99": max(p99s) if p99s else float("nan"),
            "rps": answers / r["wall_s"] if r["wall_s"] else 0.0,
            "batch": statistics.fmean(batches) if batches else float("nan")}


HEADER = (f"{'variant':>7} {'N':>4} {'group':>6} {'underruns':>9} {'robots':>6} {'refused':>7} {'p50 ms':>7}"
          f" {'p99 ms':>7} {'req/s':>6} {'batch':>5} {'late':>9} {'dl p50':>6} {'wkr CPU':>7} {'cli CPU':>7} {'load1':>5}")


def line(variant: str, r: Dict[str, Any], group: str, s: Dict[str, Any], show_late: bool) -> str:
    late = f"{s['late']}/{s['claimed']}" if show_late else "-"
    dl = f"{s['deadline_p50']:.0f}" if show_late else "-"
    return (f"{variant:>7} {r['n']:>4} {group:>6} {s['underruns']:>9d} {s['with_underruns']:>6d} {r['refused']:>7d}"
            f" {s['p50']:>7.1f} {s['p99']:>7.1f} {s['rps']:>6.1f} {s['batch']:>5.2f} {late:>9} {dl:>6}"
            f" {r['worker_cpu']:>7.2f} {r['clients_cpu']:>7.2f} {r['load1']:>5.2f}")


def deploy(gw, tmp: Path, name: str, batched: bool, hz: float, opts) -> int:
    decorator = f"    @seq.batched(max_batch_size={opts.max_batch})" if batched else ""
    path = tmp / f"{name}.py"
    path.write_text(POLICY.format(base_ms=opts.base_ms, item_ms=opts.item_ms, hz=hz, decorator=decorator))
    d = gw.deploy(str(path), name, timeout=180)
    assert d["status"] == "ready", d
    c = gw.connect_ready(name, timeout=180)
    WORKER_URLS[name] = c.get("worker_url") or c.get("url")
    gw.client.delete(f"/v1/sessions/{c['session_id']}")      # leave no session holding a slot
    return int(gw.status(name)["pid"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--robots", default="1,2,4,8,16,32,64,96", help="comma-separated fleet sizes")
    ap.add_argument("--seconds", type=float, default=20.0, help="driving time per fleet (s)")
    ap.add_argument("--procs", type=int, default=2, help="client processes per fleet")
    ap.add_argument("--variants", default="serial,fifo,edf", help="serial, fifo, edf (comma-separated)")
    ap.add_argument("--mixed", type=int, default=24, help="robots in the mixed-rate case (0: skip it)")
    ap.add_argument("--base-ms", type=float, default=40.0, help="cost of one infer call (ms)")
    ap.add_argument("--item-ms", type=float, default=2.0, help="cost per batch item (ms)")
    ap.add_argument("--max-batch", type=int, default=16, help="@seq.batched(max_batch_size=...)")
    ap.add_argument("--serial-max", type=int, default=32, help="largest N the serial variant runs")
    opts = ap.parse_args()
    sizes = [int(x) for x in opts.robots.split(",") if x.strip()]
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]

    from _servers import GatewayProcess

    print(f"one replica; infer costs {opts.base_ms:g} ms + {opts.item_ms:g} ms per item (time.sleep, GIL"
          f" released); 8 rows at 15 Hz per chunk (533 ms); {opts.procs} client processes; synchronized"
          f" start; {opts.seconds:g} s per fleet; {os.cpu_count()} CPUs; load average at start"
          f" {os.getloadavg()[0]:.2f}", flush=True)
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        gw = GatewayProcess.start(tmp)
        try:
            pids = {v: deploy(gw, tmp, f"fleet-{v}", v != "serial", 15.0, opts) for v in variants}
            for n in sizes:            # the variants take turns at each N: they meet the same load
                for variant in variants:
                    if variant == "serial" and n > opts.serial_max:
                        continue
                    r = run_fleet(gw, f"fleet-{variant}", pids[variant], [8] * n, variant == "edf", opts)
                    print(line(variant, r, "all", summarize(r, r["robots"]), variant == "edf"), flush=True)
                    for e in r["errors"][:3]:
                        print(f"     error: {e}")
            for v in variants:
                gw.stop(f"fleet-{v}")
            if opts.mixed:
                pid = deploy(gw, tmp, "fleet-mixed", True, 50.0, opts)
                n = opts.mixed
                chunks = [27 if i % 2 == 0 else 8 for i in range(n)]
                for variant in ("fifo", "edf"):
                    r = run_fleet(gw, "fleet-mixed", pid, chunks, variant == "edf", opts, hz=50.0)
                    for group, rows in (("540ms", 27), ("160ms", 8)):
                        mine = [x for x in r["robots"] if x["chunk"] == rows]
                        print(line(variant, r, group, summarize(r, mine), variant == "edf"), flush=True)
                    for e in r["errors"][:3]:
                        print(f"     error: {e}")
                gw.stop("fleet-mixed")
        finally:
            gw.close()
    print("(underruns: sum over robots; robots: how many had any; refused: robots whose connect was refused"
          " or still queued after 30 s; p50: the median of the robots' own p50 round trips; p99: the worst"
          " robot's p99; req/s: answers per wall second; batch: mean batch size of the answers; late: answers"
          " the worker marked past their deadline / answers to requests that claimed one; dl p50: the median"
          " deadline_ms claimed; CPU: CPU s per"
          f" wall s, the clients summed; load1 at the end of each fleet); load average at the end"
          f" {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
