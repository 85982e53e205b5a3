"""The worker's own overhead per /act, and what @seq.batched buys.

    . scripts/env.sh && python bench/bench_worker.py            # ~40 s

1. Server CPU per request (in-process, the exact code the worker runs: body parse + contract
   check + JPEG decode + chunk check), for a 2 x 224x224 JPEG observation with 7+1 proprio,
   JSON (base64 frames) vs the binary body (raw JPEG blobs). p50 / p99 of wall time and of
   thread CPU time over many requests. Goal: <= 0.4 ms CPU per request.
2. The same requests over HTTP to a real worker process on loopback (round trip p50, one client).
3. Throughput of a policy whose batch cost is sublinear (40 ms + 2 ms per item), unbatched vs
   @seq.batched(max_batch_size=16), with 16 robots calling back to back, serve mode.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "server")]

import httpx  # noqa: E402
from PIL import Image  # noqa: E402

from sequence_ai_core.protocol import BINARY_CONTENT_TYPE, encode_act_body  # noqa: E402
from sequence_ai_server.worker.host import PolicyHost, load_policy_class  # noqa: E402
from sequence_ai_server.worker.action_check import check_chunk  # noqa: E402

POLICY = '''
import numpy as np
import seq

@seq.policy(
    action=seq.ActionContract(robot="panda", action_space="joint_absolute", action_dim=8, control_frequency_hz=15.0,
                              bounds=[(-3.0, 3.0)] * 7 + [(0.0, 1.0)]),
    observation=seq.ObservationContract(cameras={"exterior_1": seq.Camera(224, 224), "wrist_left": seq.Camera(224, 224)},
                                        proprio={"joint_positions": 7, "gripper": 1}),
)
class Bench(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.chunk = np.zeros((16, 8))
    @seq.infer
    def infer(self, obs: seq.Observation, *, open_loop_horizon: int = 8) -> seq.ActionChunk:
        return seq.ActionChunk(self.chunk, open_loop_horizon=open_loop_horizon)
'''

BATCH_POLICY = '''
import time
import seq

@seq.policy(action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=2, control_frequency_hz=15.0))
class Sublinear(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass
    {decorator}
    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        n = len(obs) if isinstance(obs, list) else 1
        time.sleep(0.040 + 0.002 * n)              # a GPU's batch cost: fixed launch + small per item
        out = [seq.ActionChunk([[0.0, 0.0]] * 8) for _ in range(n)]
        return out if isinstance(obs, list) else out[0]
'''


def _frame(seed: int, noise: float = 20.0) -> bytes:
    """A 224x224 JPEG q95: a gradient plus Gaussian noise (sigma 20: camera-like; 2: a sim render)."""
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, 224 * 224 * 3).reshape(224, 224, 3)
    img = np.clip(base + rng.normal(0, noise, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def bodies(noise: float = 20.0) -> tuple[bytes, bytes]:
    """The same /act body as JSON (base64 frames) and in the binary framing (raw JPEG blobs)."""
    frames = [_frame(0, noise), _frame(1, noise)]
    proprio = {"joint_positions": [0.1] * 7, "gripper": [0.5]}
    body = {"observation": {"images": [{"view": v, "data": f, "timestamp_ms": 0}
                                       for v, f in zip(("exterior_1", "wrist_left"), frames)],
                            "proprioception": proprio, "instruction": "put the red cube on the green pad"},
            "params": {"open_loop_horizon": 8}, "episode_id": "ep_bench"}
    return encode_act_body(body, binary=False)[0], encode_act_body(body, binary=True)[0]


def pct(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(p / 100 * len(xs)))]


def overhead(host: PolicyHost, raw: bytes, ctype: str, n: int) -> dict:
    result = host.replicas[0].method("infer")
    wall, cpu = [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.thread_time()
        prepared = host.prepare(raw, ctype)
        check_chunk(result(prepared.observation, **prepared.params), host.spec)
        cpu.append((time.thread_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return {"wall_p50": pct(wall, 50), "wall_p99": pct(wall, 99), "cpu_p50": pct(cpu, 50), "cpu_p99": pct(cpu, 99)}


class Worker:
    def __init__(self, file: Path, tmp: Path, name: str):
        self.secret = secrets.token_urlsafe(16)
        ready = tmp / f"{name}.ready.json"
        env = {**os.environ, "SEQ_WORKER_SECRET": self.secret, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "server")])}
        self.log = open(tmp / f"{name}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "sequence_ai_server.worker", "--file", str(file), "--port", "0",
                                      "--ready-file", str(ready), "--name", name, "--weights-dir", str(tmp / f"{name}-w")],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp / f"{name}.log").read_text()[-2000:])
            time.sleep(0.05)
        self.url = json.loads(ready.read_text())["url"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)
        self.log.close()


def round_trip(w: Worker, raw: bytes, ctype: str, n: int) -> float:
    headers = {"Authorization": f"Bearer {w.secret}", "Content-Type": ctype}
    times = []
    with httpx.Client(base_url=w.url, timeout=30) as c:
        for i in range(n + 20):
            t0 = time.perf_counter()
            r = c.post("/act", content=raw, headers=headers)
            if i >= 20:
                times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
    return statistics.median(times)


def throughput(w: Worker, robots: int, seconds: float) -> tuple[float, float]:
    body = json.dumps({"observation": {"instruction": "x"}}).encode()
    done, sizes = [0] * robots, []
    barrier = threading.Barrier(robots + 1)
    stop = [0.0]

    def robot(i: int) -> None:
        with httpx.Client(base_url=w.url, timeout=30) as c:
            barrier.wait()
            while time.monotonic() < stop[0]:
                r = c.post("/act", content=body, headers={"Authorization": f"Bearer {w.secret}",
                                                          "Content-Type": "application/json"})
                assert r.status_code == 200, r.text
                done[i] += 1
                sizes.append(r.json()["batch_size"])
    threads = [threading.Thread(target=robot, args=(i,)) for i in range(robots)]
    [t.start() for t in threads]
    stop[0] = time.monotonic() + 60.0          # set before the robots are let go (they read it at once)
    barrier.wait()
    t0 = time.monotonic()
    stop[0] = t0 + seconds
    [t.join() for t in threads]
    if not sizes:
        raise RuntimeError("no request completed")
    return sum(done) / (time.monotonic() - t0), statistics.mean(sizes)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    policy = tmp / "bench_policy.py"
    policy.write_text(POLICY)
    import simplejpeg
    host = PolicyHost(load_policy_class(str(policy)), "bench")
    host.start(str(tmp / "w"))
    print("\n1. worker overhead per /act, in-process (parse + contract check + JPEG decode + chunk check);"
          " 2 x 224x224 JPEG q95 + 8 proprio values; goal <= 0.4 ms cpu")
    n = 1500
    for kind, noise in (("camera-like frames (noise sigma 20)", 20.0), ("sim-render frames (noise sigma 2)", 2.0)):
        js, bn = bodies(noise)
        frame = _frame(0, noise)
        t0 = time.thread_time()
        for _ in range(300):
            simplejpeg.decode_jpeg(frame, colorspace="RGB")
        decode_ms = (time.thread_time() - t0) / 300 * 1000
        print(f"   {kind}: {len(frame) / 1024:.1f} KiB per frame; simplejpeg decode alone {decode_ms:.3f} ms cpu per frame")
        for label, raw, ctype in (("json  ", js, "application/json"), ("binary", bn, BINARY_CONTENT_TYPE)):
            overhead(host, raw, ctype, 150)                                  # warm up
            r = overhead(host, raw, ctype, n)
            print(f"     {label} body {len(raw) / 1024:5.1f} KiB  cpu p50 {r['cpu_p50']:.3f} ms  p99 {r['cpu_p99']:.3f} ms"
                  f"  wall p50 {r['wall_p50']:.3f} ms  p99 {r['wall_p99']:.3f} ms"
                  f"  | without the 2 decodes: cpu p50 {r['cpu_p50'] - 2 * decode_ms:.3f} ms")
    host.stop()
    js, bn = bodies(20.0)

    print("\n2. HTTP round trip to a worker process on loopback (one client, p50)")
    w = Worker(policy, tmp, "rt")
    try:
        rj = round_trip(w, js, "application/json", 300)
        rb = round_trip(w, bn, BINARY_CONTENT_TYPE, 300)
        print(f"   json {rj:.2f} ms   binary {rb:.2f} ms   ratio json/binary {rj / rb:.2f}")
    finally:
        w.stop()

    print("\n3. throughput, sublinear batch cost (40 ms + 2 ms/item), 16 robots back to back, serve mode")
    results = {}
    for label, decorator in (("unbatched", ""), ("batched  ", "@seq.batched(max_batch_size=16)")):
        f = tmp / f"sub_{label.strip()}.py"
        f.write_text(textwrap.dedent(BATCH_POLICY).replace("    {decorator}", "    " + decorator))
        w = Worker(f, tmp, label.strip())
        try:
            throughput(w, 16, 1.5)                                           # warm up
            results[label] = throughput(w, 16, 4.0)
        finally:
            w.stop()
        rps, mean_batch = results[label]
        print(f"   {label}  {rps:7.1f} req/s   mean batch {mean_batch:.1f}")
    ratio = results["batched  "][0] / results["unbatched"][0]
    print(f"   batched / unbatched throughput: {ratio:.1f}x")


if __name__ == "__main__":
    main()
