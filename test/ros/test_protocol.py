"""The wire protocol's one home (``sequence_ai_core/protocol.py``), checked from both sides.

* the binary /act framing: what ``encode_act_body`` writes, ``decode_act_body`` / ``frame_bytes``
  read back unchanged, for every field an observation carries (camera frames with history and
  timestamps, depth, proprioception, instruction, params, episode fields), and the exact bytes;
* the error table: every code the server raises is in it, the server answers each with the
  table's status and retryable, and the client turns each into the class the table names;
* the typed contract views, read from the dicts the server really sends (``seq`` contracts);
* public errors print and pickle as ``sequence_ai.X``;
* the ROS observation assembler hands raw JPEG bytes (the client's encoder) to the binary body.
"""
from __future__ import annotations

import base64
import json
import pickle
import re
import traceback
from pathlib import Path

import httpx
import numpy as np
import pytest
import simplejpeg

import seq
import sequence_ai
import sequence_ai_core
from sequence_ai_core.protocol import (BINARY_CONTENT_TYPE, ERROR_CODES, JSON_CONTENT_TYPE, MAX_BODY_BYTES,
                                       ActionSpec, Contract, FramingError, ObservationSpec, decode_act_body,
                                       encode_act_body, frame_bytes)

ROOT = Path(__file__).resolve().parents[2]


def _jpeg(shade: int, w: int = 32, h: int = 24) -> bytes:
    return simplejpeg.encode_jpeg(np.full((h, w, 3), shade, np.uint8), quality=95, colorspace="RGB")


def _png16(w: int = 8, h: int = 6) -> bytes:
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(np.arange(w * h, dtype=np.uint16).reshape(h, w) * 7).save(buf, format="PNG")
    return buf.getvalue()


def _full_body() -> dict:
    """An /act body with every field: two views with a history of two frames each (raw bytes and
    base64 text mixed), a depth map, proprioception, instruction, params and episode fields."""
    frames = {("exterior_1", 0): _jpeg(10), ("exterior_1", 1): _jpeg(20), ("wrist_left", 0): _jpeg(200),
              ("wrist_left", 1): _jpeg(250)}
    images = [{"view": v, "data": data if k % 2 == 0 else base64.b64encode(data).decode(), "timestamp_ms": 1000 + k}
              for (v, k), data in frames.items()]
    return {"observation": {"images": images, "depth": [{"view": "exterior_1", "data": _png16()}],
                            "proprioception": {"joint_positions": [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7],
                                               "gripper": [0.04]},
                            "instruction": "put the red cube on the green pad"},
            "params": {"open_loop_horizon": 8, "temperature": 0.5}, "episode_id": "ep-7", "end_episode": False}


def _raw_frames(body: dict) -> list[bytes]:
    return [d if isinstance(d, bytes) else base64.b64decode(d) for d in
            (img["data"] for img in body["observation"]["images"])]


def test_binary_framing_round_trips_every_field_and_its_bytes_are_the_documented_layout():
    body = _full_body()
    raw, ctype = encode_act_body(body, binary=True)
    assert ctype == BINARY_CONTENT_TYPE == "application/vnd.sequence-ai.act+bin"
    n = int.from_bytes(raw[:4], "big")
    head = json.loads(raw[4:4 + n])
    frames = _raw_frames(body)
    assert raw[4 + n:] == b"".join(frames)                       # the blobs, in order, nothing else
    offsets = [img["blob"] for img in head["observation"]["images"]]
    assert offsets == [[sum(map(len, frames[:i])), len(f)] for i, f in enumerate(frames)]
    assert all("data" not in img for img in head["observation"]["images"])
    assert head["observation"]["depth"][0]["data"] == base64.b64encode(_png16()).decode()  # depth stays base64

    decoded, blobs = decode_act_body(raw, BINARY_CONTENT_TYPE + "; v=1")
    obs = decoded["observation"]
    got = [bytes(frame_bytes(img, img["view"], blobs)) for img in obs["images"]]
    assert got == frames
    assert [(i["view"], i["timestamp_ms"]) for i in obs["images"]] == \
        [(i["view"], i["timestamp_ms"]) for i in body["observation"]["images"]]
    assert bytes(frame_bytes(obs["depth"][0], "depth", blobs)) == _png16()
    assert obs["proprioception"] == body["observation"]["proprioception"]
    assert obs["instruction"] == body["observation"]["instruction"]
    assert {k: decoded[k] for k in ("params", "episode_id", "end_episode")} == \
        {"params": {"open_loop_horizon": 8, "temperature": 0.5}, "episode_id": "ep-7", "end_episode": False}


def test_json_body_round_trips_to_the_same_observation_as_the_binary_one():
    body = _full_body()
    as_json, jtype = encode_act_body(body, binary=False)
    as_bin, _ = encode_act_body(body, binary=True)
    assert jtype == JSON_CONTENT_TYPE
    j, jblobs = decode_act_body(as_json, "application/json; charset=utf-8")
    b, bblobs = decode_act_body(as_bin, BINARY_CONTENT_TYPE)
    assert jblobs is None
    assert [bytes(frame_bytes(i, "v", jblobs)) for i in j["observation"]["images"]] == \
        [bytes(frame_bytes(i, "v", bblobs)) for i in b["observation"]["images"]] == _raw_frames(body)
    strip = lambda o: {k: v for k, v in o.items() if k != "images"}  # noqa: E731
    assert strip(j["observation"]) == strip(b["observation"])
    # no camera frames: JSON whichever format was asked for
    assert encode_act_body({"observation": {"instruction": "x"}}, binary=True)[1] == JSON_CONTENT_TYPE


@pytest.mark.parametrize("raw, ctype, needle", [
    (b"\x00\x00", BINARY_CONTENT_TYPE, "4-byte JSON length"),
    (b"\x00\x00\x10\x00{}", BINARY_CONTENT_TYPE, "declares 4096 bytes of JSON but carries 2"),
    (b"{}", "text/plain", "is not accepted"),
    (b"{nope", "application/json", "not valid JSON"),
    (b"[1]", "application/json", "must be a JSON object"),
    (b"{}", "", "has no observation"),
])
def test_malformed_bodies_raise_framing_errors_naming_the_problem(raw, ctype, needle):
    with pytest.raises(FramingError) as info:
        decode_act_body(raw, ctype)
    assert needle in info.value.detail and isinstance(info.value, ValueError)


def test_frame_references_outside_the_blobs_or_without_the_binary_body_are_refused():
    raw, _ = encode_act_body({"observation": {"images": [{"view": "a", "data": _jpeg(1)}]}}, binary=True)
    _, blobs = decode_act_body(raw, BINARY_CONTENT_TYPE)
    for ref in ([0, len(blobs) + 1], [-1, 3], [0, 0], [True, 2], "0,3"):
        with pytest.raises(FramingError, match="is not an \\[offset, length\\]"):
            frame_bytes({"blob": ref}, "view 'a'", blobs)
    with pytest.raises(FramingError, match="need the binary body"):
        frame_bytes({"blob": [0, 1]}, "view 'a'", None)
    with pytest.raises(FramingError, match="not valid base64"):
        frame_bytes({"data": "***"}, "view 'a'", None)
    assert MAX_BODY_BYTES == 32 * 1024 * 1024


# ---------------------------------------------------------------- the error table

def _codes_raised_by_the_server() -> set[str]:
    found = set()
    for path in (ROOT / "server" / "sequence_ai_server").rglob("*.py"):
        found |= set(re.findall(r'ApiError\(\s*"([a-z_]+)"', path.read_text()))
    return found


def test_every_code_the_server_raises_is_in_the_table_and_answered_with_its_status():
    from sequence_ai_server.common.errors import CODES, ApiError
    raised = _codes_raised_by_the_server()
    assert {"invalid_request", "unauthorized", "warming", "queued", "policy_error"} <= raised
    assert raised <= set(ERROR_CODES), raised - set(ERROR_CODES)
    assert CODES == {code: (row.status, row.retryable) for code, row in ERROR_CODES.items()}
    for code, row in ERROR_CODES.items():
        err = ApiError(code, "x")
        assert (err.status, err.retryable) == (row.status, row.retryable)
        assert err.response().status_code == row.status


def test_every_code_becomes_the_client_class_the_table_names_and_every_class_has_a_code():
    for code, row in ERROR_CODES.items():
        response = httpx.Response(row.status, json={"detail": "d", "code": code, "retryable": row.retryable})
        err = sequence_ai_core.from_response(response)
        cls = getattr(sequence_ai, row.client_class)
        assert type(err) is cls, (code, type(err))
        assert err.code == code and err.retryable is row.retryable and err.status_code == row.status
    server_facing = {sequence_ai.AuthError, sequence_ai.OutOfCredit, sequence_ai.InvalidRequest,
                     sequence_ai.ContractMismatch, sequence_ai.Unavailable, sequence_ai.PolicyError}
    assert {getattr(sequence_ai, row.client_class) for row in ERROR_CODES.values()} - {sequence_ai.SequencesError} \
        == server_facing


# ---------------------------------------------------------------- contract views

def _wire_contract() -> dict:
    """The contract dict a handshake carries, as the server writes it (seq's to_dict)."""
    obs = seq.ObservationContract(
        cameras={"exterior_1": seq.Camera(224, 224, depth=True), "wrist_left": seq.Camera(128, 96)},
        proprio={"joint_positions": 7, "gripper": 1}, history=2)
    act = seq.ActionContract(robot="franka_panda", action_space="joint_absolute", action_dim=8,
                             control_frequency_hz=15, bounds=[(-3.0, 3.0)] * 8, max_delta=0.2, on_violation="refuse")
    contract = {"observation": obs.to_dict(), "action": act.to_dict()}
    return json.loads(json.dumps(contract))            # exactly what crosses the wire


def test_contract_views_read_what_the_server_sends():
    wire = _wire_contract()
    c = Contract.from_wire(wire)
    assert c.declared
    assert c.observation == ObservationSpec.from_wire(wire["observation"])
    cams = c.observation.cameras
    assert list(cams) == ["exterior_1", "wrist_left"]
    assert (cams["exterior_1"].size, cams["exterior_1"].depth) == ((224, 224), True)
    assert (cams["wrist_left"].size, cams["wrist_left"].depth) == ((128, 96), False)
    assert c.observation.proprio == {"joint_positions": 7, "gripper": 1} and c.observation.history == 2
    a = c.action
    assert (a.robot, a.action_space, a.action_dim, a.control_frequency_hz) == ("franka_panda", "joint_absolute", 8, 15)
    assert a.bounds == [[-3.0, 3.0]] * 8 and a.max_delta == 0.2 and a.on_violation == "refuse"
    assert a.declared("action_dim") == 8 and a == ActionSpec.from_wire(wire["action"])


def test_contract_views_of_no_contract_and_of_a_list_of_camera_names():
    for nothing in (None, {}, {"observation": None, "action": None}, "not a dict"):
        c = Contract.from_wire(nothing)
        assert c.observation is None and c.action is None and not c.declared
    c = Contract.from_wire({"observation": {"cameras": ["front", {"name": "wrist"}]}})
    assert list(c.observation.cameras) == ["front", "wrist"] and c.observation.cameras["front"].size is None
    assert c.observation.history == 1 and c.action is None


def test_the_client_checks_observations_with_the_views():
    from sequence_ai_core._contract import check_expect, check_observation, drop_undeclared_views
    c = Contract.from_wire(_wire_contract())
    wire = {"images": [{"view": "exterior_1"}, {"view": "top"}], "proprioception": {"joint_positions": [0.0] * 6}}
    assert drop_undeclared_views(wire, c.observation) == ["top"]
    assert check_observation(wire, c.observation) == [
        "missing view(s) ['wrist_left']", "proprioception.joint_positions has 6 values, model reads 7",
        "proprioception.gripper missing (model reads 1)"]
    assert check_expect({"action_dim": 8, "control_frequency_hz": 15.0}, c.action) == []
    assert check_expect({"action_space": "ee_delta"}, c.action) == \
        ["action_space: expected 'ee_delta', model declares 'joint_absolute'"]
    obs = sequence_ai.observation(contract=_wire_contract(),
                                  images={"exterior_1": [np.zeros((224, 224, 3), np.uint8)] * 2,
                                          "wrist_left": [np.zeros((96, 128, 3), np.uint8)] * 2},
                                  depth={"exterior_1": np.zeros((224, 224))}, joints=[0.0] * 7, gripper=[0.0])
    assert [f.view for f in obs.images] == ["exterior_1", "exterior_1", "wrist_left", "wrist_left"]


# ---------------------------------------------------------------- public names

def test_public_errors_show_their_public_path_and_still_pickle_and_catch():
    for name in ("SequencesError", "AuthError", "OutOfCredit", "InvalidRequest", "ContractMismatch", "Unavailable",
                 "PolicyError", "ChunkExhausted", "TransportError", "ConnectionLost", "Observation", "ImageFrame",
                 "ActionChunk", "RunOutcome", "Contract"):
        assert getattr(sequence_ai, name).__module__ == "sequence_ai", name
    assert repr(sequence_ai.AuthError) == "<class 'sequence_ai.AuthError'>"
    try:
        raise sequence_ai_core.AuthError("missing or invalid API key", code="unauthorized", status_code=401)
    except sequence_ai.SequencesError as exc:
        text = "".join(traceback.format_exception(exc))
        assert "sequence_ai.AuthError: missing or invalid API key" in text and "_errors" not in text.splitlines()[-1]
        back = pickle.loads(pickle.dumps(exc))
    assert type(back) is sequence_ai.AuthError and back.code == "unauthorized" and back.status_code == 401
    with pytest.raises(sequence_ai_core.AuthError):
        raise back
    obs = sequence_ai.Observation(images=[sequence_ai.ImageFrame("a", b"\xff\xd8")],
                                  proprioception=sequence_ai.Proprioception(joint_positions=[0.0]), instruction="x")
    assert pickle.loads(pickle.dumps(obs)) == obs


# ---------------------------------------------------------------- the ROS assembler's frames

def test_the_ros_assembler_sends_raw_jpeg_from_the_clients_encoder_without_base64():
    from types import SimpleNamespace

    from sequence_ai_ros.codecs import DecodedImage
    from sequence_ai_ros.observation import ObservationAssembler
    rgb = (np.arange(48 * 64 * 3) % 251).astype(np.uint8).reshape(48, 64, 3)
    asm = ObservationAssembler(["exterior_1"], ["j1", "j2"], max_age_s=60.0)
    asm.on_frame("exterior_1", DecodedImage(rgb), stamp_s=1.0)
    asm.on_joint_state(SimpleNamespace(name=["j1", "j2"], position=[0.1, 0.2], velocity=[], effort=[],
                                       header=SimpleNamespace(stamp=SimpleNamespace(sec=1, nanosec=0))))
    obs = asm.build("pick")
    data = obs.images[0].data
    assert isinstance(data, bytes) and data == sequence_ai.encode_jpeg_bytes(rgb, 95, size=(64, 48))
    raw, ctype = encode_act_body({"observation": sequence_ai_core._types.observation_to_wire(obs)}, binary=True)
    n = int.from_bytes(raw[:4], "big")
    assert ctype == BINARY_CONTENT_TYPE and raw[4 + n:] == data          # the body carries those bytes as they are
