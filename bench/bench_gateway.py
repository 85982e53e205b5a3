"""Gateway benchmark: warm connect latency and cold-start time for the toy (echo) policy.

    python bench/bench_gateway.py [--connects 300] [--colds 5]

Starts a real gateway (``python -m sequence_ai_server.gateway``, temp data dir) on loopback,
deploys test/policies/echo_policy.py and measures, in one run:

  - warm connect: ``POST /v1/connect`` round trips on a kept-alive httpx client while the worker
    is ready (key check, session admit, lease signing) -> p50 / p99 / mean in ms;
  - warm /v1/act through the gateway versus /act straight on the worker (one 64x64 PNG) -> p50 ms
    and the ratio (what the gateway proxy costs a curl user);
  - warm connect under a 50/50 traffic split between v1 (a side worker) and v2 (serving) ->
    p50 per version and the share each got (``seq policy traffic echo v1=50 v2=50``);
  - cold start: ``seq policy stop``-equivalent, then connect -> 503 warming ... -> 200, polled
    every 20 ms -> median / min / max seconds, with the gateway's Retry-After estimate beside it.

Prints medians and ratios; no pass/fail.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "server"))
sys.path.insert(0, str(ROOT))

from _servers import ECHO_POLICY, GatewayProcess, echo_observation  # noqa: E402


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connects", type=int, default=300)
    ap.add_argument("--acts", type=int, default=100)
    ap.add_argument("--colds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess.start(Path(tmp))
        try:
            d = gw.deploy(ECHO_POLICY, "echo")
            assert d["status"] == "ready", d
            c = gw.client
            for _ in range(20):
                c.post("/v1/connect", json={"model": "echo"})
            lat = []
            for _ in range(args.connects):
                t0 = time.perf_counter()
                r = c.post("/v1/connect", json={"model": "echo"})
                lat.append((time.perf_counter() - t0) * 1000.0)
                assert r.status_code == 200, r.text
                c.delete(f"/v1/sessions/{r.json()['session_id']}")
            base = []
            for _ in range(100):
                t0 = time.perf_counter()
                c.get("/healthz")
                base.append((time.perf_counter() - t0) * 1000.0)
            print(f"baseline GET /healthz (no work) p50 {pct(base, 50):.2f} ms  (this machine's HTTP floor)")
            print(f"warm connect      n={len(lat)}  p50 {pct(lat, 50):.2f} ms  p99 {pct(lat, 99):.2f} ms  "
                  f"mean {statistics.fmean(lat):.2f} ms")

            s = c.post("/v1/connect", json={"model": "echo"}).json()
            body = {"observation": echo_observation(), "params": {}}
            direct, proxied = [], []
            with httpx.Client(timeout=30) as w:
                for i in range(args.acts + 10):
                    t0 = time.perf_counter()
                    r = w.post(s["worker_url"] + "/act", json=body, headers={"Authorization": f"Bearer {s['direct_secret']}"})
                    t1 = time.perf_counter()
                    r2 = c.post("/v1/act", json={"model": "echo", **body})
                    t2 = time.perf_counter()
                    assert r.status_code == 200 and r2.status_code == 200, (r.text, r2.text)
                    if i >= 10:
                        direct.append((t1 - t0) * 1000.0)
                        proxied.append((t2 - t1) * 1000.0)
            print(f"warm act          direct p50 {pct(direct, 50):.2f} ms   via /v1/act p50 {pct(proxied, 50):.2f} ms   "
                  f"ratio {pct(proxied, 50) / pct(direct, 50):.2f}x")

            variant = Path(tmp) / "echo_v2" / "echo_policy.py"
            variant.parent.mkdir()
            variant.write_text(Path(ECHO_POLICY).read_text() + "\n# v2\n")
            assert gw.deploy(str(variant), "echo")["version"] == 2
            r = c.post("/v1/deployments/echo/traffic", json={"split": {"v1": 50, "v2": 50}})
            assert r.status_code == 200, r.text
            while c.get("/v1/deployments/echo/traffic").json()["side_workers"][0]["worker"] != "ready":
                time.sleep(0.05)                          # v1's side worker loads beside the serving v2
            by_version: dict[int, list[float]] = {1: [], 2: []}
            for _ in range(args.connects):
                t0 = time.perf_counter()
                r = c.post("/v1/connect", json={"model": "echo"})
                ms = (time.perf_counter() - t0) * 1000.0
                assert r.status_code == 200, r.text
                by_version[r.json()["version"]].append(ms)
                c.delete(f"/v1/sessions/{r.json()['session_id']}")
            n = sum(len(v) for v in by_version.values())
            print(f"split connect     v1 (side) p50 {pct(by_version[1], 50):.2f} ms  v2 (serving) p50 "
                  f"{pct(by_version[2], 50):.2f} ms  share v1 {len(by_version[1]) / n:.3f} (asked 0.500)")
            c.post("/v1/deployments/echo/traffic", json={"clear": True})

            colds, estimates = [], []
            for _ in range(args.colds):
                gw.stop("echo")
                t0 = time.perf_counter()
                first = gw.connect("echo")
                assert first.status_code == 503, first.text
                estimates.append(first.json()["retry_after_s"])
                while True:
                    r = gw.connect("echo")
                    if r.status_code == 200:
                        break
                    assert r.status_code == 503 and r.json()["retryable"], r.text
                    time.sleep(0.02)
                colds.append(time.perf_counter() - t0)
            print(f"cold start        n={len(colds)}  median {statistics.median(colds):.2f} s  "
                  f"min {min(colds):.2f} s  max {max(colds):.2f} s  (first Retry-After estimates: "
                  f"{', '.join(f'{e:g}' for e in estimates)} s)")
            print(f"cold / warm connect ratio  {statistics.median(colds) * 1000.0 / pct(lat, 50):.0f}x")
        finally:
            gw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
