"""Fleet serving: how many robots one replica of a GPU-like policy serves at their deadlines,
and how many two workers on two (fake) cards serve.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_fleet.py \
        [--robots 1,2,4,8,16,32,64,96,128] [--seconds 20] [--procs 2] [--variants serial,fifo,edf] \
        [--mixed 24] [--two-cards 32,192] [--base-ms 40] [--item-ms 2] [--max-batch 16] [--max-inputs 256]
    ... python bench/bench_fleet.py --backend ray [--ray-robots 128,256] [--seconds 20]

The policy costs like a GPU model: one ``infer`` call sleeps ``--base-ms`` (40) + ``--item-ms``
(2) per batch item, with the GIL released (``time.sleep``), so the worker's CPU is what the
server itself spends. Its chunk is 8 rows at the contract's 15 Hz: each robot needs a chunk
every 533 ms. It declares ``@seq.concurrent(max_inputs=256, target_inputs=256)``, so the
gateway's admission at the deadline decides how many robots a worker takes (its measured cost
curve against the robots' request rates; docs/guides/scaling.md), ``on_full="reject"``: a robot
that does not fit is refused with ``deployment_full`` and the numbers. Starts a real gateway
(``python -m sequence_ai_server.gateway``, temp data dir, ``SEQ_FAKE_GPUS`` = eight L4s,
``SEQ_WORKER_MAX_CONNECTIONS=512``) on loopback and deploys the variants side by side
(``gpu="L4"``, one card and one worker each, idle while another variant drives; at each N the
variants take turns, so they meet the same load). Each deployment is warmed up first (a short
unreported fleet) so that its worker has measured its calls before the robots connect:

* ``serial`` -- one request at a time (no ``@seq.batched``), first come first served;
* ``fifo``   -- ``@seq.batched(max_batch_size=16)``; the clients send no deadline (as before
  deadlines existed: the replica serves first come first served, batches what waits);
* ``edf``    -- the same policy with the default client: each request carries its deadline
  and period (``deadline_ms``, ``period_ms``), ordered by the worker's rule (due half the
  robot's period after it arrives; docs/benchmarks.md, "The deadline rule").

Every robot declares its rate at connect (``request_hz`` = 15 Hz / 8 rows). ``--two-cards``:
the serial and edf variants again with ``max_gpus=2``, for those fleet sizes: the first worker
takes what admission allows, the next connect starts a second worker on the second card (the
client waits it out, ``warming``) and the rest land there until it is full too.

For each N, N robots are spread over ``--procs`` (2) client processes, each robot an asyncio
task with the real client (``sequence_ai.aconnect``; connect through the gateway, then /act to
the worker on the /act channel); all start at one monotonic instant and drive ``--seconds`` of
wall time (``until``: the same window for every robot, underrunning or not). observe() hands
back one pre-built observation (7 joint values, no camera: the client costs no encoding);
act() does nothing. A robot whose connect is refused or queued is counted and does not drive.

Per N: underruns (sum over robots), robots with any, robots refused at connect, workers the
admitted robots landed on, per-robot p50 / p99 round trip (each robot's own p50 and p99 of its
/act round trips, its first, cold request left out of the p99; then the median of those and the
worst), requests/s (answers per wall second, all robots), mean batch size (the answers'
``batch_size``), late (edf: answers the worker marked past the deadline the request claimed,
of the answers to requests that claimed one), dl p50 (edf: the median deadline_ms claimed), the
workers' and the clients' CPU (CPU s per wall s, /proc/PID/stat; 1.0 = one core busy) and the
1-minute load average.

``--mixed N`` adds the mixed-rate case on one replica: N/2 robots needing a chunk every 540 ms
(27 rows at 50 Hz, the 15 Hz rhythm) and N/2 every 160 ms (8 rows at 50 Hz), fifo against edf,
reported per group.

``--backend ray``: the same policy and default client (edf) on a Ray cluster of two nodes on
127.0.0.1 (bench_ray.py's: a head with 4 CPUs and a second node with 2, one logical GPU each,
so ``gpu="L4"`` workers go one per node); the gateway runs ``SEQ_BACKEND=ray``. One worker
(``max_gpus=1``) is offered the first of ``--ray-robots``, then two workers (``max_gpus=2``:
admission starts the second when the first is full, and Ray places it on the other node) the
second. Per worker: its Ray node (from the deployment's status), robots, underruns and the
worst robot's p99; per fleet: admitted, refused, req/s, batch, CPU, load; and the robots served
with no underrun by two workers against one. Prints figures; no pass/fail.
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
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "server"))
sys.path.insert(0, str(ROOT))

POLICY = '''
import time
import numpy as np
import seq

BASE_S, ITEM_S = {base_ms} / 1000.0, {item_ms} / 1000.0


@seq.policy(gpu="L4", max_gpus={cards}, on_full="reject",
            action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=7,
                                      control_frequency_hz={hz}, bounds=[(-10.0, 10.0)] * 7),
            observation=seq.ObservationContract(proprio={{"joint_positions": 7}}))
@seq.concurrent(max_inputs={max_inputs}, target_inputs={max_inputs})
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
    refused, reasons = 0, []
    try:
        for chunk_len in args["chunks"]:
            p = sequence_ai.aconnect(args["model"], api_key=args["api_key"], gateway_url=args["url"],
                                     params={"chunk_len": chunk_len}, **_declared(args, chunk_len))
            try:
                await asyncio.wait_for(p.connect(), timeout=30)
                if p._wire.session is None:         # a worker starting for it (warming): wait it out
                    await p.wait_until_ready(timeout_s=60)
            except Exception as exc:  # noqa: BLE001 - refused (deployment_full) or queued past 30 s: counted
                refused += 1
                reasons.append(str(exc))
                try:
                    await p.aclose()
                except Exception:  # noqa: BLE001
                    pass
                continue
            rec: Dict[str, Any] = {"chunk": chunk_len, "rtt_ms": [], "batch": [], "late": 0, "deadline_ms": [],
                                   "worker": p._wire.session.worker_url}
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
            row = {k: r[k] for k in ("chunk", "rtt_ms", "batch", "late", "deadline_ms", "worker")}
            if isinstance(out, BaseException):
                row["error"] = f"{type(out).__name__}: {out}"
            else:
                row["underruns"] = out.underruns
            rows.append(row)
        results.put({"robots": rows, "refused": refused, "reasons": reasons})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which prints it
        results.put({"robots": [], "refused": refused, "reasons": reasons, "error": f"{type(exc).__name__}: {exc}"})
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

def _declared(args: Dict[str, Any], chunk_len: int) -> Dict[str, Any]:
    """The connect keywords that declare the robot's request rate (``request_hz``: control Hz
    over the rows it plays per chunk), where the client has the option."""
    from sequence_ai_core._options import ConnectOptions

    if "request_hz" not in ConnectOptions.__dataclass_fields__:
        return {}
    return {"request_hz": args["hz"] / chunk_len}


def _workers(gw, model: str) -> List[Dict[str, Any]]:
    """The ready workers of ``model`` (``pid``, ``url``, ``worker``) from its status."""
    return [w for w in gw.client.get(f"/v1/deployments/{model}").json().get("workers") or [] if w.get("url")]


def run_fleet(gw, model: str, chunks: List[int], deadlines: bool, opts, hz: float = 15.0,
              seconds: float = 0.0) -> Dict[str, Any]:
    ctx = mp.get_context("spawn")
    n = len(chunks)
    seconds = seconds or opts.seconds
    procs_n = max(1, min(opts.procs, n))
    shares = [chunks[i::procs_n] for i in range(procs_n)]
    ready, go = ctx.Barrier(procs_n + 1), ctx.Barrier(procs_n + 1)
    start_at = ctx.Value("d", 0.0)
    results = ctx.Queue()
    procs = []
    for share in shares:
        args = {"chunks": share, "url": gw.url, "api_key": gw.api_key, "model": model,
                "seconds": seconds, "deadlines": deadlines, "hz": hz}
        pr = ctx.Process(target=client_process, args=(args, ready, go, start_at, results), daemon=True)
        pr.start()
        procs.append(pr)
    ready.wait(timeout=600)  # every robot connected (or refused)
    workers = _workers(gw, model)
    start_at.value = time.monotonic() + 0.5
    late0 = _late(workers)
    go.wait(timeout=60)
    time.sleep(max(0.0, start_at.value - time.monotonic()))
    cpu0, t0 = sum(proc_cpu_s(w["pid"]) for w in workers), time.monotonic()
    clients0 = sum(proc_cpu_s(pr.pid) for pr in procs)
    time.sleep(seconds)
    cpu1, t1 = sum(proc_cpu_s(w["pid"]) for w in workers), time.monotonic()
    clients1 = sum(proc_cpu_s(pr.pid) for pr in procs)
    load1 = os.getloadavg()[0]
    collected = [results.get(timeout=seconds + 300) for _ in procs]
    for pr in procs:
        pr.join(timeout=60)
    late1 = _late(workers)
    robots = [r for c in collected for r in c["robots"]]
    errors = [c["error"] for c in collected if c.get("error")] + [r["error"] for r in robots if "error" in r]
    reasons = [x for c in collected for x in c.get("reasons", [])]
    return {"n": n, "robots": robots, "errors": errors, "refused": sum(c["refused"] for c in collected),
            "reasons": reasons, "workers": len({r["worker"] for r in robots}),
            "late": late1[1] - late0[1], "with_deadline": late1[0] - late0[0],
            "worker_cpu": (cpu1 - cpu0) / (t1 - t0), "clients_cpu": (clients1 - clients0) / (t1 - t0),
            "wall_s": t1 - t0, "load1": load1}


def _late(workers: List[Dict[str, Any]]) -> tuple:
    import httpx

    got = [0, 0]
    for w in workers:
        try:
            d = httpx.get(f"{w['url']}/ping", timeout=10).json().get("deadlines") or {}
            got[0] += d.get("requests", 0)
            got[1] += d.get("late", 0)
        except Exception:  # noqa: BLE001 - a figure, not a check
            pass
    return tuple(got)


def summarize(r: Dict[str, Any], robots: List[Dict[str, Any]]) -> Dict[str, Any]:
    ok = [x for x in robots if "error" not in x]
    p50s = [pct(x["rtt_ms"], 50) for x in ok if x["rtt_ms"]]
    p99s = [pct(x["rtt_ms"][1:], 99) for x in ok if x["rtt_ms"][1:]]       # the cold first request apart
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


HEADER = (f"{'variant':>9} {'N':>4} {'group':>6} {'underruns':>9} {'robots':>6} {'refused':>7} {'wkrs':>4}"
          f" {'p50 ms':>7} {'p99 ms':>7} {'req/s':>6} {'batch':>5} {'late':>9} {'dl p50':>6} {'wkr CPU':>7}"
          f" {'cli CPU':>7} {'load1':>5}")


def line(variant: str, r: Dict[str, Any], group: str, s: Dict[str, Any], show_late: bool) -> str:
    late = f"{s['late']}/{s['claimed']}" if show_late else "-"
    dl = f"{s['deadline_p50']:.0f}" if show_late else "-"
    return (f"{variant:>9} {r['n']:>4} {group:>6} {s['underruns']:>9d} {s['with_underruns']:>6d} {r['refused']:>7d}"
            f" {r['workers']:>4d} {s['p50']:>7.1f} {s['p99']:>7.1f} {s['rps']:>6.1f} {s['batch']:>5.2f} {late:>9}"
            f" {dl:>6} {r['worker_cpu']:>7.2f} {r['clients_cpu']:>7.2f} {r['load1']:>5.2f}")


def deploy(gw, tmp: Path, name: str, batched: bool, hz: float, opts, cards: int = 1) -> None:
    """Deploy one variant (``cards``: its max_gpus, one fake L4 per worker), wait for its first
    worker, and warm its measured cost curve up (admission counts robots against max_inputs
    alone until a worker has measured its calls): a short unreported fleet of robots."""
    decorator = f"    @seq.batched(max_batch_size={opts.max_batch})" if batched else ""
    path = tmp / f"{name}.py"
    path.write_text(POLICY.format(base_ms=opts.base_ms, item_ms=opts.item_ms, hz=hz, decorator=decorator,
                                  cards=cards, max_inputs=opts.max_inputs))
    d = gw.deploy(str(path), name, timeout=180)
    assert d["status"] == "ready", d
    c = gw.connect_ready(name, timeout=180)
    gw.client.delete(f"/v1/sessions/{c['session_id']}")      # leave no session holding a slot
    run_fleet(gw, name, [8] * (opts.max_batch if batched else 4), True, opts, hz=hz, seconds=3.0)
    time.sleep(2.5)                                           # one health round: the gateway reads the curve


def _print(variant: str, r: Dict[str, Any], groups, show_late: bool) -> None:
    for group, rows in groups:
        mine = [x for x in r["robots"] if rows is None or x["chunk"] == rows]
        print(line(variant, r, group, summarize(r, mine), show_late), flush=True)
    for e in r["errors"][:3]:
        print(f"     error: {e}")
    if r["reasons"]:
        print(f"     refused ({len(r['reasons'])}), e.g.: {r['reasons'][0][:300]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--robots", default="1,2,4,8,16,32,64,96,128", help="comma-separated fleet sizes")
    ap.add_argument("--seconds", type=float, default=20.0, help="driving time per fleet (s)")
    ap.add_argument("--procs", type=int, default=2, help="client processes per fleet")
    ap.add_argument("--variants", default="serial,fifo,edf", help="serial, fifo, edf (comma-separated)")
    ap.add_argument("--mixed", type=int, default=24, help="robots in the mixed-rate case (0: skip it)")
    ap.add_argument("--two-cards", default="32,192", help="fleet sizes on two workers on two fake cards "
                    "(serial up to 2 x --serial-max, then edf; empty: skip)")
    ap.add_argument("--base-ms", type=float, default=40.0, help="cost of one infer call (ms)")
    ap.add_argument("--item-ms", type=float, default=2.0, help="cost per batch item (ms)")
    ap.add_argument("--max-batch", type=int, default=16, help="@seq.batched(max_batch_size=...)")
    ap.add_argument("--max-inputs", type=int, default=256, help="@seq.concurrent(max_inputs=...): the robot cap")
    ap.add_argument("--serial-max", type=int, default=32, help="largest N the serial variant runs")
    ap.add_argument("--backend", default="local", choices=("local", "ray"),
                    help="ray: one worker, then two spread over a 2-node loopback Ray cluster (--ray-robots)")
    ap.add_argument("--ray-robots", default="128,256", help="--backend ray: robots offered to one worker, then to two")
    opts = ap.parse_args()
    if opts.backend == "ray":
        return ray_main(opts)
    sizes = [int(x) for x in opts.robots.split(",") if x.strip()]
    two = [int(x) for x in opts.two_cards.split(",") if x.strip()]
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]

    from _servers import GatewayProcess

    print(f"one replica per worker; infer costs {opts.base_ms:g} ms + {opts.item_ms:g} ms per item (time.sleep,"
          f" GIL released); 8 rows at 15 Hz per chunk (533 ms); {opts.procs} client processes; synchronized"
          f" start; {opts.seconds:g} s per fleet; {os.cpu_count()} CPUs; load average at start"
          f" {os.getloadavg()[0]:.2f}", flush=True)
    print(HEADER, flush=True)
    env = {"SEQ_FAKE_GPUS": ",".join(["L4"] * 8), "SEQ_WORKER_MAX_CONNECTIONS": "512"}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        gw = GatewayProcess.start(tmp, env=env)
        try:
            for v in variants:
                deploy(gw, tmp, f"fleet-{v}", v != "serial", 15.0, opts)
            for n in sizes:            # the variants take turns at each N: they meet the same load
                for variant in variants:
                    if variant == "serial" and n > opts.serial_max:
                        continue
                    r = run_fleet(gw, f"fleet-{variant}", [8] * n, variant == "edf", opts)
                    _print(variant, r, [("all", None)], variant == "edf")
            for v in variants:
                gw.stop(f"fleet-{v}")
            for variant in ("serial", "edf") if two else ():
                name = f"fleet-{variant}-2cards"
                deploy(gw, tmp, name, variant != "serial", 15.0, opts, cards=2)
                for n in two:
                    if variant == "serial" and n > 2 * opts.serial_max:
                        continue
                    r = run_fleet(gw, name, [8] * n, variant == "edf", opts)
                    _print(f"{variant} x2", r, [("all", None)], variant == "edf")
                gw.stop(name)
            if opts.mixed:
                deploy(gw, tmp, "fleet-mixed", True, 50.0, opts)
                chunks = [27 if i % 2 == 0 else 8 for i in range(opts.mixed)]
                for variant in ("fifo", "edf"):
                    r = run_fleet(gw, "fleet-mixed", chunks, variant == "edf", opts, hz=50.0)
                    _print(variant, r, [("540ms", 27), ("160ms", 8)], variant == "edf")
                gw.stop("fleet-mixed")
        finally:
            gw.close()
    print("(underruns: sum over robots; robots: how many had any; refused: robots whose connect was refused"
          " or still queued after 30 s; wkrs: workers the admitted robots landed on; p50: the median of the"
          " robots' own p50 round trips; p99: the worst robot's p99, its first (cold) request left out;"
          " req/s: answers per wall second; batch: mean batch size of the answers; late: answers"
          " the worker marked past their deadline / answers to requests that claimed one; dl p50: the median"
          " deadline_ms claimed; CPU: CPU s per wall s, the workers and the clients summed; load1 at the end of"
          f" each fleet); load average at the end {os.getloadavg()[0]:.2f}")
    return 0


# ----------------------------------------------------------------- --backend ray

def _per_worker(gw, model: str, r: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The admitted robots of ``r`` grouped by the worker they landed on: ``worker`` (its key),
    ``node`` (the Ray node id its status names), ``robots``, ``underruns``, ``with_underruns``,
    ``p99`` (the worst robot's p99 round trip, ms)."""
    by_url = {w["url"]: w for w in _workers(gw, model)}
    out = []
    for url in sorted({x["worker"] for x in r["robots"]}):
        mine = [x for x in r["robots"] if x["worker"] == url and "error" not in x]
        w = by_url.get(url, {})
        s = summarize(r, mine)
        out.append({"worker": w.get("worker", url), "node": w.get("node"), "robots": len(mine),
                    "underruns": s["underruns"], "with_underruns": s["with_underruns"], "p99": s["p99"]})
    return out


def ray_main(opts) -> int:
    """The cost-model policy (edf: the default client) on a Ray head plus a second node, both on
    127.0.0.1 with one logical GPU each, so a worker of ``gpu="L4"`` fits one per node: one
    worker (max_gpus=1) offered the first of ``--ray-robots``, then two workers (max_gpus=2, the
    second started by admission when the first is full, placed by Ray on the other node) offered
    the second. Prints each worker's node, robots, underruns and p99, the refusals, and the ratio
    of robots served with no underrun, two workers against one."""
    import bench_ray

    from _servers import GatewayProcess

    one, two = [int(x) for x in opts.ray_robots.split(",")][:2]
    print(f"Ray backend, 2-node loopback cluster (head: 4 CPUs, 1 GPU; node 2: 2 CPUs, 1 GPU; gpu=\"L4\" workers);"
          f" infer {opts.base_ms:g} ms + {opts.item_ms:g} ms per item, max_batch {opts.max_batch}; 8 rows at 15 Hz;"
          f" {opts.seconds:g} s per fleet; {os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.2f}",
          flush=True)
    procs, address = bench_ray.start_cluster(group=True)
    served = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        gw = None
        try:
            gw = GatewayProcess.start(tmp, env={"SEQ_BACKEND": "ray", "SEQ_RAY_ADDRESS": address, **bench_ray.RAY_AUTH,
                                                "SEQ_WORKER_MAX_CONNECTIONS": "512"}, timeout=90)
            for cards, n in ((1, one), (2, two)):
                name = f"fleet-ray-{cards}"
                deploy(gw, tmp, name, True, 15.0, opts, cards=cards)
                r = run_fleet(gw, name, [8] * n, True, opts)
                s = summarize(r, r["robots"])
                served[cards] = s["robots"] - s["with_underruns"]
                print(f"{cards} worker(s), {n} robots offered: admitted {s['robots']}, refused {r['refused']},"
                      f" underruns {s['underruns']} ({s['with_underruns']} robots), p50 {s['p50']:.1f} ms,"
                      f" p99 {s['p99']:.1f} ms, {s['rps']:.1f} req/s, batch {s['batch']:.2f},"
                      f" late {s['late']}/{s['claimed']}, worker CPU {r['worker_cpu']:.2f},"
                      f" client CPU {r['clients_cpu']:.2f}, load1 {r['load1']:.2f}", flush=True)
                for w in _per_worker(gw, name, r):
                    print(f"    {w['worker']:>14}  node {str(w['node'])[:8]}  robots {w['robots']:>4}"
                          f"  underruns {w['underruns']:>4} ({w['with_underruns']} robots)  p99 {w['p99']:.1f} ms",
                          flush=True)
                for e in r["errors"][:3]:
                    print(f"     error: {e}")
                if r["reasons"]:
                    print(f"     refused ({len(r['reasons'])}), e.g.: {r['reasons'][0][:300]}")
                gw.stop(name)
        finally:
            if gw is not None:
                gw.close()
            bench_ray.stop_cluster(procs)
    if served.get(1):
        print(f"robots served with no underrun: two workers {served[2]}, one {served[1]}:"
              f" {served[2] / served[1]:.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
