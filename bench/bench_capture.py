"""What capture costs /act: round-trip p50/p99 with capture off, rate 1.0, rate 1.0 --images.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_capture.py     # ~40 s

A real gateway and echo-policy worker on loopback; one client sends JSON /act bodies with one
64x64 PNG frame back to back, each phase its own episodes. Also the in-process cost of
``CaptureWriter.offer`` (the only capture work on the /act path), and the writer's throughput.
Printed: medians, p99s and the ratios against capture off, measured in this one run.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "test"), str(ROOT / "server"), str(ROOT)]

from _servers import ECHO_POLICY, GatewayProcess, echo_observation  # noqa: E402


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(n: int = 400) -> None:
    import json

    from sequence_ai_server.worker.capture import CaptureWriter
    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess.start(Path(tmp), env={"SEQ_CAPTURE_POLL_S": "0.2"})
        try:
            assert gw.deploy(ECHO_POLICY, "bench")["status"] == "ready"
            c = gw.connect_ready("bench")
            http = httpx.Client(base_url=c["worker_url"], headers={"Authorization": f"Bearer {c['direct_secret']}"})
            obs = echo_observation()
            results = {}
            for label, body in (("off", {"off": True}), ("rate 1.0", {"rate": 1.0}),
                                ("rate 1.0 --images", {"rate": 1.0, "images": True}), ("off again", {"off": True})):
                gw.client.put("/v1/deployments/bench/capture", json=body).raise_for_status()
                time.sleep(1.0)   # > the worker's 0.2 s re-read period
                times = []
                for i in range(n):
                    t0 = time.perf_counter()
                    r = http.post("/act", json={"observation": obs, "episode_id": f"{label}-{i // 20}"})
                    times.append((time.perf_counter() - t0) * 1000.0)
                    assert r.status_code == 200, r.text
                results[label] = times
            base = statistics.median(results["off"])
            print(f"/act round trip over loopback, {n} requests per phase (ms)")
            for label, times in results.items():
                med = statistics.median(times)
                print(f"  {label:20s} p50 {med:6.2f}  p99 {_pct(times, 0.99):6.2f}  ratio p50 vs off {med / base:5.2f}")
            time.sleep(1.0)
            kept = gw.client.get("/v1/deployments/bench/capture").json()
            print(f"  kept: {kept['episodes']} episodes, {kept['steps']} steps, {kept['bytes'] / 1e6:.2f} MB")
        finally:
            gw.close()

        raw = json.dumps({"observation": echo_observation(), "episode_id": "e"}).encode()
        d = Path(tmp) / "cap"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"enabled": True, "rate": 1.0, "images": True}))
        w = CaptureWriter(d, poll_s=0.1)
        time.sleep(0.3)
        chunk = {"actions": [[0.0] * 8] * 10}
        t_off = []
        for i in range(2000):
            t0 = time.perf_counter()
            w.offer(raw, "application/json", f"e{i // 50}", {"chunk_len": 10}, chunk, f"r{i}", 1.0)
            t_off.append((time.perf_counter() - t0) * 1e6)
            if i % 200 == 199:
                w.flush()
        t0 = time.perf_counter()
        w.flush(60)
        print(f"CaptureWriter.offer (on the /act path), 2000 calls: p50 {statistics.median(t_off):.1f} us, "
              f"p99 {_pct(t_off, 0.99):.1f} us; dropped {w.dropped}")
        n0 = w.written
        t0 = time.perf_counter()
        for i in range(1000):
            w.offer(raw, "application/json", f"x{i // 50}", {}, chunk, f"q{i}", 1.0)
        w.flush(60)
        dt = time.perf_counter() - t0
        print(f"writer throughput with frames: {(w.written - n0) / dt:.0f} steps/s ({w.dropped} dropped)")
        w.close()


if __name__ == "__main__":
    main()
