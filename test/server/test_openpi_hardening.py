"""The openpi-compatible endpoint under malformed input: each bad message is answered with the
typed error (a text frame holding the common error body) and the connection keeps serving; the
codec refuses what is not an observation (a malformed ndarray map, a non-numeric dtype, dicts
nested without end) with ValueError / ApiError, never another exception."""
from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest
from websockets.sync.client import connect as ws_connect

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.worker.openpi import MAX_DEPTH, observation_from_openpi, packb, unpackb


def _nd(**fields):
    base = {b"__ndarray__": True, b"data": b"\0" * 16, b"dtype": "<f4", b"shape": [4]}
    base.update({k.encode(): v for k, v in fields.items()})
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("bad, match", [
    (_nd(dtype=None), "lacks its b'dtype'"),
    (_nd(shape=None), "lacks its b'shape'"),
    (_nd(shape=5), "malformed"),
    (_nd(shape=[-1, -4]), "does not match"),
    (_nd(shape=[2 ** 32, 2 ** 32], data=b""), "does not match"),
    (_nd(dtype="<M8[s]", data=b"\0" * 32), "not accepted"),
    (_nd(dtype="<c8", data=b"\0" * 32), "not accepted"),
    ({b"__npgeneric__": True, b"data": 1, b"dtype": "|O"}, "not accepted"),
    ({b"__npgeneric__": True, b"data": "zz", b"dtype": "<f8"}, "malformed|could not convert"),
])
def test_a_malformed_array_map_is_a_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        unpackb(msgpack.packb({b"a": bad}))


def test_text_vectors_deep_nesting_and_a_non_text_prompt_are_typed_errors():
    words = unpackb(packb({"joint": np.array(["a", "b"])}))
    with pytest.raises(ApiError) as text:
        observation_from_openpi(words, None)
    assert text.value.code == "contract_mismatch" and "'joint'" in text.value.detail
    deep: dict = {}
    cur = deep
    for _ in range(500):
        cur["k"] = {}
        cur = cur["k"]
    with pytest.raises(ApiError) as nested:
        observation_from_openpi(unpackb(packb(deep)), None)
    assert nested.value.code == "invalid_request" and nested.value.details["max_depth"] == MAX_DEPTH
    with pytest.raises(ApiError) as prompt:
        observation_from_openpi({"prompt": 17, "state": np.zeros(2)}, None)
    assert prompt.value.code == "invalid_request" and "'prompt'" in prompt.value.detail
    nan = np.full((4, 4, 3), np.nan, np.float32)
    with pytest.raises(ApiError) as image:
        observation_from_openpi({"cam": nan}, None)
    assert image.value.code == "invalid_request" and "NaN" in image.value.detail
    ok = observation_from_openpi(unpackb(packb({"prompt": np.array("pick"), "state": np.arange(2.0)})), None)
    assert ok.instruction == "pick" and ok.proprio["state"].tolist() == [0.0, 1.0]


def test_malformed_messages_are_answered_with_typed_errors_and_the_connection_serves_on(worker):
    good = packb({"observation/exterior_1": np.zeros((64, 64, 3), np.uint8), "observation/joint_position": np.arange(7.0),
                  "observation/state": np.concatenate([np.arange(7.0), [0.25]]), "prompt": "pick"})
    deep: dict = {}
    cur = deep
    for _ in range(200):
        cur[b"k"] = {}
        cur = cur[b"k"]
    bad = [msgpack.packb({b"a": _nd(dtype=None)}),                          # KeyError before
           packb({"observation/exterior_1": np.zeros((64, 64, 3), np.uint8), "state": np.array(["x"] * 8)}),
           msgpack.packb(deep),
           b"\xc1not msgpack",
           msgpack.packb([1, 2, 3])]
    with ws_connect(f"ws://127.0.0.1:{worker.port}/", max_size=None, proxy=None,
                    additional_headers={"Authorization": f"Api-Key {worker.secret}"}) as ws:
        meta = unpackb(ws.recv(timeout=30))
        assert meta["server"] == "sequence-ai"
        codes = []
        for message in bad:
            ws.send(message)
            answer = ws.recv(timeout=30)
            assert isinstance(answer, str), answer[:80]
            codes.append(json.loads(answer)["code"])
        ws.send(good)
        out = unpackb(ws.recv(timeout=30))
    assert codes == ["invalid_request", "contract_mismatch", "invalid_request", "invalid_request", "invalid_request"]
    assert out["actions"].shape == (10, 8)
    assert worker.proc.poll() is None
