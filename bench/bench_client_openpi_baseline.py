"""BASELINE, not our wire: openpi's websocket protocol measured with the real ``openpi-client``
(PyPI) against a minimal msgpack-numpy websocket server written here, because openpi's server
(``openpi/serving/websocket_policy_server.py``) is not on PyPI. The server follows that
protocol: first frame = packed metadata, then one packed observation in, one packed answer out
(with ``server_timing.infer_ms``), raw uint8 arrays, no compression.

Runs in its own virtualenv (openpi-client pins numpy<2): ``bench/run_client_benches.py`` creates
``.venv/openpi-baseline`` with ``pip install openpi-client websockets`` and calls this file.
Prints one JSON line: p50/p99 round trip (ms), bytes per request, client and server CPU per request.
"""
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
import websockets.sync.server
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
server_cpu = {"s": 0.0}


def handler(ws):
    packer = msgpack_numpy.Packer()
    ws.send(packer.pack({"name": "baseline"}))
    while True:
        try:
            msg = ws.recv()
        except Exception:
            return
        c0 = time.thread_time()
        obs = msgpack_numpy.unpackb(msg)
        t0 = time.monotonic()
        actions = np.zeros((16, 8))
        actions[:, :7] = obs["state"][:7]
        infer_ms = (time.monotonic() - t0) * 1000
        out = packer.pack({"actions": actions, "server_timing": {"infer_ms": infer_ms}})
        server_cpu["s"] += time.thread_time() - c0
        ws.send(out)


server = websockets.sync.server.serve(handler, "127.0.0.1", 0, compression=None, max_size=None)
port = server.socket.getsockname()[1]
threading.Thread(target=server.serve_forever, daemon=True).start()

client = WebsocketClientPolicy("127.0.0.1", port)
rng = np.random.default_rng(0)
obs = {"observation/exterior_image_1_left": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
       "observation/wrist_image_left": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
       "state": np.zeros(8), "prompt": "put the red cube on the green pad"}
for _ in range(20):
    client.infer(obs)
server_cpu["s"] = 0.0
rtts = []
c0 = time.process_time()
for _ in range(N):
    t0 = time.perf_counter()
    client.infer(obs)
    rtts.append((time.perf_counter() - t0) * 1000)
total_cpu = time.process_time() - c0  # client + server threads: one process
size = len(msgpack_numpy.Packer().pack(obs))
q = statistics.quantiles(rtts, n=100)
print(json.dumps({"p50_ms": statistics.median(rtts), "p99_ms": q[98], "bytes": size,
                  "client_cpu_ms": (total_cpu - server_cpu["s"]) / N * 1000,
                  "server_cpu_ms": server_cpu["s"] / N * 1000}))
server.shutdown()
