"""The openpi-compatible endpoint: openpi's own client (``openpi-client`` 0.1.2 from PyPI, in a side
venv because it pins numpy<2) drives a real worker process on loopback, unmodified.

The side venv is ``.venv/sides/openpi-client`` (scripts/bootstrap.sh creates it; this module creates
it when missing and the index can be reached)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from _servers import ROOT
from sequence_ai_server.common.leases import sign_lease
from sequence_ai_server.worker.openpi import observation_from_openpi, packb, unpackb

SIDE = ROOT / ".venv" / "sides" / "openpi-client"
SIDE_PY = SIDE / "bin" / "python"

# Runs in the side venv: connect with openpi's client, print what it saw as JSON lines.
_CLIENT = r"""
import json, sys
import numpy as np
from openpi_client import websocket_client_policy as wcp
port, key, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
policy = wcp.WebsocketClientPolicy("127.0.0.1", port, api_key=key)
meta = policy.get_server_metadata()
print(json.dumps({"metadata": meta}, default=str), flush=True)
img = np.zeros((64, 64, 3), np.uint8)
if mode == "droid":
    obs = {"observation/exterior_1": img, "observation/joint_position": np.arange(7.0),
           "observation/state": np.concatenate([np.arange(7.0), [0.25]]), "prompt": "pick"}
elif mode == "aloha":
    obs = {"images": {"exterior_1": np.zeros((3, 64, 64), np.uint8)},
           "state": np.concatenate([np.arange(7.0), [2.0]]).astype(np.float32), "prompt": "pick"}
for i in range(2):
    out = policy.infer(obs)
    print(json.dumps({"shape": list(out["actions"].shape), "dtype": str(out["actions"].dtype),
                      "row0": out["actions"][0].tolist(), "timing": sorted(out["server_timing"])}), flush=True)
try:
    policy.infer({"observation/exterior_1": np.zeros((32, 32, 3), np.uint8), "state": np.zeros(8), "prompt": "x"})
except RuntimeError as exc:
    print(json.dumps({"error": str(exc)}), flush=True)
out = policy.infer(obs)
print(json.dumps({"after_error": out["actions"][0].tolist()}), flush=True)
"""


def _side_python() -> Path:
    if not SIDE_PY.exists():
        subprocess.run([sys.executable, "-m", "venv", str(SIDE)], check=True, timeout=300)
        subprocess.run([str(SIDE_PY), "-m", "pip", "install", "-q", "openpi-client==0.1.2", "typing_extensions"], check=True, timeout=900)
    return SIDE_PY


def _run_client(port: int, key: str, mode: str) -> list[dict]:
    done = subprocess.run([str(_side_python()), "-c", _CLIENT, str(port), key, mode], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_openpi_client_drives_a_worker_unmodified(worker):
    lines = _run_client(worker.port, worker.secret, "droid")
    meta = lines[0]["metadata"]
    assert meta["server"] == "sequence-ai" and meta["action_dim"] == 8
    assert meta["contract"]["observation"]["cameras"]["exterior_1"]["width"] == 64
    first, second = lines[1], lines[2]
    assert first["shape"] == [10, 8] and first["dtype"] == "float32"
    assert first["timing"] == ["infer_ms", "total_ms"]
    # joint_positions[2:7] from observation/state (no joint_positions key), gripper = 0.25
    assert first["row0"][2:8] == [2.0, 3.0, 4.0, 5.0, 6.0, 0.25]
    assert second["row0"][0] == first["row0"][0] + 1
    err = json.loads(lines[3]["error"].split("\n", 1)[1])
    assert err["code"] == "contract_mismatch" and "32x32" in err["detail"] and "64x64" in err["detail"]
    assert lines[4]["after_error"][0] == second["row0"][0] + 1      # the connection stayed usable


def test_nested_chw_frames_and_a_lease_token(worker):
    token = sign_lease(worker.secret, "sess_openpi", 1, time.time() + 60)
    lines = _run_client(worker.port, token, "aloha")
    assert lines[1]["shape"] == [10, 8] and lines[1]["row0"][2:8] == [2.0, 3.0, 4.0, 5.0, 6.0, 1.0]  # gripper clipped


def test_a_wrong_key_is_refused_before_the_websocket_opens(worker):
    script = ("import sys\nfrom openpi_client import websocket_client_policy as w\n"
              "try:\n    w.WebsocketClientPolicy('127.0.0.1', int(sys.argv[1]), api_key='wrong')\n"
              "except Exception as e:\n    print(type(e).__name__, getattr(getattr(e, 'response', None), 'status_code', None))\n")
    done = subprocess.run([str(_side_python()), "-c", script, str(worker.port)], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "InvalidStatus 401", done.stdout + done.stderr[-2000:]


def test_the_codec_refuses_object_arrays_and_short_data():
    packed = packb({"a": np.arange(4, dtype=np.float32)})
    assert unpackb(packed)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    import msgpack
    short = msgpack.packb({b"a": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f4", b"shape": [4]}})
    with pytest.raises(ValueError, match="does not match"):
        unpackb(short)
    obj = msgpack.packb({b"a": {b"__ndarray__": True, b"data": b"", b"dtype": "|O", b"shape": [0]}})
    with pytest.raises(ValueError, match="not accepted"):
        unpackb(obj)


def test_the_state_vector_must_fit_the_declared_proprioception():
    from seq import Camera, ObservationContract
    from sequence_ai_server.common.errors import ApiError
    contract = ObservationContract(cameras={"image": Camera(8, 8)}, proprio={"eef": 6, "gripper": 2})
    obs = observation_from_openpi({"observation/image": np.zeros((8, 8, 3), np.uint8),
                                   "observation/state": np.arange(8.0), "prompt": "go"}, contract)
    assert obs.proprio["gripper"].tolist() == [6.0, 7.0] and obs.instruction == "go"
    with pytest.raises(ApiError) as wrong:
        observation_from_openpi({"observation/image": np.zeros((8, 8, 3), np.uint8),
                                 "observation/state": np.arange(7.0)}, contract)
    assert wrong.value.code == "contract_mismatch" and "7 values" in wrong.value.detail


def test_openpi_observations_are_metered_like_http_act(worker):
    import httpx
    from websockets.sync.client import connect as ws_connect

    def usage() -> dict:
        return httpx.get(f"http://127.0.0.1:{worker.port}/ping", trust_env=False).json()["usage"]

    img = np.zeros((64, 64, 3), np.uint8)
    good = packb({"observation/exterior_1": img, "observation/state": np.arange(8.0), "prompt": "pick"})
    bad = packb({"observation/exterior_1": np.zeros((32, 32, 3), np.uint8), "state": np.zeros(8)})
    before = usage()
    received = 0
    with ws_connect(f"ws://127.0.0.1:{worker.port}/", max_size=None, proxy=None,
                    additional_headers={"Authorization": f"Api-Key {worker.secret}"}) as ws:
        ws.recv(timeout=30)                                   # the metadata message is not an /act
        for message in (good, bad, good):
            answer = ws.recv(timeout=30) if ws.send(message) is None else None
            received += len(answer if isinstance(answer, bytes) else answer.encode())
    after = usage()
    assert after["requests"] - before["requests"] == 3
    assert after["errors"] - before["errors"] == 1            # the 32x32 frame: contract_mismatch
    assert after["bytes_in"] - before["bytes_in"] == 2 * len(good) + len(bad)
    assert after["bytes_out"] - before["bytes_out"] == received
