"""The worker on its own: a real ``python -m sequence_ai_server.worker`` process on loopback,
checked the way a robot client would call it."""
from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time

import httpx
import pytest

from _servers import ECHO_POLICY, POLICIES, WorkerProcess, echo_observation, png_b64
from _wait import eventually

from sequence_ai_core.protocol import BINARY_CONTENT_TYPE, encode_act_body

ECHO_BODY_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    w = WorkerProcess.start(ECHO_POLICY, tmp_path_factory.mktemp("echo-worker"), name="echo",
                            env={"SEQ_WORKER_MAX_BODY_BYTES": str(ECHO_BODY_LIMIT)})
    yield w
    w.stop()


def _error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"detail", "code", "retryable", "retry_after_s", "request_id", "hint", "details"}
    assert body["code"] == code
    assert body["request_id"] and r.headers["x-request-id"] == body["request_id"]
    return body


def _policy_file(tmp_path, body: str, name: str = "p.py") -> str:
    path = tmp_path / name
    path.write_text("import os, time\nimport numpy as np\nimport seq\n" + textwrap.dedent(body))
    return str(path)


def test_ready_file_reports_the_bound_port_and_pid(echo):
    assert echo.info["pid"] == echo.proc.pid
    assert echo.info["url"] == f"http://127.0.0.1:{echo.port}"
    assert echo.info["spec"]["contract"]["action"]["action_dim"] == 8
    r = echo.client.get("/ping")
    assert r.status_code == 200 and r.json()["status"] == "ready"


def test_act_returns_a_chunk_filled_from_the_contract(echo):
    r = echo.act({"observation": echo_observation(joint_positions=[0, 1, 2, 3, 4, 5, 6]), "params": {"chunk_len": 4}})
    assert r.status_code == 200, r.text
    body = r.json()
    chunk = body["action_chunk"]
    assert (chunk["action_space"], chunk["robot"], chunk["control_frequency_hz"]) == ("joint_absolute", "panda", 15.0)
    assert len(chunk["actions"]) == 4 and all(len(row) == 8 for row in chunk["actions"])
    assert [row[1] for row in chunk["actions"]] == [0, 1, 2, 3]
    assert chunk["actions"][0][2:7] == [2, 3, 4, 5, 6] and chunk["actions"][0][7] == 0.5
    assert body["warnings"] == [] and body["inference_ms"] >= 0
    assert body["request_id"].startswith("req_") and r.headers["x-request-id"] == body["request_id"]


def test_chunks_carry_the_request_counter(echo):
    ids = [echo.act({"observation": echo_observation()}).json()["action_chunk"]["actions"][0][0] for _ in range(3)]
    assert ids[1] == ids[0] + 1 and ids[2] == ids[1] + 1


def test_jpeg_frames_are_accepted(echo):
    obs = echo_observation(views={"exterior_1": png_b64(fmt="JPEG", color=(200, 10, 10))})
    assert echo.act({"observation": obs}).status_code == 200


def test_wrong_secret_is_401(echo):
    _error(echo.act({"observation": echo_observation()}, secret="not-the-secret"), 401, "unauthorized")
    _error(echo.act({"observation": echo_observation()}, secret=""), 401, "unauthorized")


def test_a_missing_view_is_400_naming_it(echo):
    body = _error(echo.act({"observation": echo_observation(views={"wrist": png_b64()})}), 400, "invalid_request")
    assert "missing view(s) ['exterior_1']" in body["detail"] and "exterior_1 (64x64)" in body["detail"]
    assert body["details"]["missing_views"] == ["exterior_1"]


def test_a_wrong_frame_size_is_400_naming_the_sizes(echo):
    body = _error(echo.act({"observation": echo_observation(views={"exterior_1": png_b64(32, 48)})}), 400, "invalid_request")
    assert "frame is 32x48, this policy reads 64x64" in body["detail"]
    # the advice is the spec's frame rule: hand the client the native frame, it resamples once
    assert "native frame" in body["hint"] and "64x64" in body["hint"], body["hint"]


def test_a_wrong_proprio_width_is_400_naming_the_field(echo):
    body = _error(echo.act({"observation": echo_observation(joint_positions=[0.0] * 6)}), 400, "invalid_request")
    assert "proprioception.joint_positions has 6 value(s); this policy reads 7" in body["detail"]
    obs = echo_observation()
    del obs["proprioception"]["gripper"]
    body = _error(echo.act({"observation": obs}), 400, "invalid_request")
    assert "missing proprioception.gripper" in body["detail"]


def test_an_empty_instruction_is_400(echo):
    body = _error(echo.act({"observation": echo_observation(instruction="  ")}), 400, "invalid_request")
    assert "instruction is empty" in body["detail"]


def test_undecodable_frames_and_malformed_bodies_are_400(echo):
    body = _error(echo.act({"observation": echo_observation(views={"exterior_1": "%%%"})}), 400, "invalid_request")
    assert "not valid base64" in body["detail"]
    body = _error(echo.act({"observation": echo_observation(views={"exterior_1": "aGVsbG8="})}), 400, "invalid_request")
    assert "not a JPEG or PNG" in body["detail"]
    body = _error(echo.act({"obs": {}}), 400, "invalid_request")
    assert "observation" in body["detail"]


def test_absurdly_nested_json_is_400_not_500(echo):
    nested = '{"observation": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = echo.client.post("/act", content=nested, headers={"Authorization": f"Bearer {echo.secret}",
                                                          "Content-Type": "application/json"})
    body = _error(r, 400, "invalid_request")
    assert "not valid JSON" in body["detail"]
    # the worker is still serving on a fresh request
    assert echo.act({"observation": echo_observation()}).status_code == 200


def test_end_episode_must_be_a_json_boolean(echo):
    body = _error(echo.act({"observation": echo_observation(), "episode_id": "ep-x", "end_episode": "false"}),
                  400, "invalid_request")
    assert "end_episode must be true or false" in body["detail"]


def test_params_are_cast_and_unknown_names_refused(echo):
    r = echo.act({"observation": echo_observation(), "params": {"chunk_len": "3"}})
    assert r.status_code == 200 and len(r.json()["action_chunk"]["actions"]) == 3
    body = _error(echo.act({"observation": echo_observation(), "params": {"chunk_length": 3}}), 400, "invalid_request")
    assert "unknown param(s) ['chunk_length']" in body["detail"] and "chunk_len" in body["detail"]
    body = _error(echo.act({"observation": echo_observation(), "params": {"chunk_len": "many"}}), 400, "invalid_request")
    assert "expects int" in body["detail"]


def test_out_of_bounds_actions_are_clipped_with_warnings(echo):
    r = echo.act({"observation": echo_observation(gripper=[1.5]), "params": {"chunk_len": 2}})
    body = r.json()
    assert r.status_code == 200
    assert [row[7] for row in body["action_chunk"]["actions"]] == [1.0, 1.0]
    assert body["warnings"] == ["clipped step 0 dim 7: 1.5 outside [0, 1]", "clipped step 1 dim 7: 1.5 outside [0, 1]"]


def test_a_policy_exception_is_500_policy_error_with_type_and_traceback(echo):
    body = _error(echo.act({"observation": echo_observation(), "params": {"fail": "KeyError"}}), 500, "policy_error")
    assert body["details"]["exception_type"] == "KeyError"
    assert "echo_policy.py" in body["details"]["remote_traceback"]
    assert "raise exc_type" in body["details"]["remote_traceback"]
    assert body["retryable"] is False


def test_policy_input_error_is_400_with_its_message(echo):
    body = _error(echo.act({"observation": echo_observation(), "params": {"fail": "PolicyInputError"}}), 400, "invalid_request")
    assert body["detail"] == "asked to fail with PolicyInputError"
    # the refusal may be about the instruction or a param: the hint claims no observation
    assert "observation" not in body["hint"] and "refused this request" in body["hint"]


def test_open_loop_horizon_is_passed_through(echo):
    r = echo.act({"observation": echo_observation(), "params": {"chunk_len": 6, "horizon": 4}})
    assert r.json()["action_chunk"]["open_loop_horizon"] == 4


def test_inference_runs_off_the_event_loop(echo):
    slow = threading.Thread(target=echo.act, args=({"observation": echo_observation(), "params": {"latency_ms": 1500}},))
    slow.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    assert echo.client.get("/ping").status_code == 200
    assert time.monotonic() - t0 < 0.5
    slow.join()


def test_one_inference_at_a_time(echo):
    results = []

    def call():
        results.append(echo.act({"observation": echo_observation(), "params": {"latency_ms": 300}}).json())
    t0 = time.monotonic()
    threads = [threading.Thread(target=call) for _ in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert time.monotonic() - t0 >= 0.85
    assert sorted(r["action_chunk"]["actions"][0][0] for r in results) == \
        list(range(int(min(r["action_chunk"]["actions"][0][0] for r in results)), int(min(r["action_chunk"]["actions"][0][0] for r in results)) + 3))


def test_refuse_on_violation_answers_policy_error_reason_bounds(tmp_path):
    f = _policy_file(tmp_path, '''
        @seq.policy(action=seq.ActionContract("arm", "joint_delta", 2, 10.0, bounds=[(-0.1, 0.1)] * 2,
                                              on_violation="refuse"))
        class P:
            @seq.load
            def load(self, weights_dir): pass
            @seq.infer
            def infer(self, obs, *, big: bool = False) -> seq.ActionChunk:
                return seq.ActionChunk([[0.5 if big else 0.0, 0.0]])
        ''')
    w = WorkerProcess.start(f, tmp_path)
    try:
        obs = {"proprioception": {}, "instruction": "x"}
        assert w.act({"observation": obs}).status_code == 200
        body = _error(w.act({"observation": obs, "params": {"big": True}}), 500, "policy_error")
        assert body["details"]["reason"] == "bounds"
        assert "step 0 dim 0" in body["detail"]
    finally:
        w.stop()


def test_max_delta_is_clipped_within_a_chunk(tmp_path):
    f = _policy_file(tmp_path, '''
        @seq.policy(action=seq.ActionContract("arm", "joint_absolute", 1, 10.0, max_delta=0.1))
        class P:
            @seq.load
            def load(self, weights_dir): pass
            @seq.infer
            def infer(self, obs: seq.Observation) -> seq.ActionChunk:
                return seq.ActionChunk([[0.0], [1.0], [1.0]])
        ''')
    w = WorkerProcess.start(f, tmp_path)
    try:
        body = w.act({"observation": {"instruction": "x"}}).json()
        assert body["action_chunk"]["actions"] == [[0.0], [0.1], [0.2]]
        assert body["warnings"][0].startswith("clipped step 1 dim 0: moves 1")
    finally:
        w.stop()


def test_a_chunk_of_the_wrong_width_or_with_nan_is_policy_error(tmp_path):
    f = _policy_file(tmp_path, '''
        @seq.policy(action=seq.ActionContract("arm", "joint_absolute", 3, 10.0))
        class P:
            @seq.load
            def load(self, weights_dir): pass
            @seq.infer
            def infer(self, obs: seq.Observation, *, kind: str = "ok") -> seq.ActionChunk:
                if kind == "wide":
                    return seq.ActionChunk(np.zeros((2, 4)))
                if kind == "nan":
                    return seq.ActionChunk([[0.0, float("nan"), 0.0]])
                return seq.ActionChunk(np.zeros((2, 3)))
        ''')
    w = WorkerProcess.start(f, tmp_path)
    try:
        obs = {"instruction": "x"}
        assert w.act({"observation": obs}).status_code == 200
        body = _error(w.act({"observation": obs, "params": {"kind": "wide"}}), 500, "policy_error")
        assert "4 values; the contract declares action_dim=3" in body["detail"]
        body = _error(w.act({"observation": obs, "params": {"kind": "nan"}}), 500, "policy_error")
        assert body["details"]["reason"] == "non_finite"
    finally:
        w.stop()


def test_load_failure_exits_non_zero_with_the_policys_error(tmp_path):
    w = WorkerProcess.start(str(POLICIES / "broken_load_policy.py"), tmp_path, wait=False)
    assert w.proc.wait(timeout=30) == 3
    err = json.loads((tmp_path / "w.ready.json.error").read_text())
    assert err["phase"] == "loading" and err["exception_type"] == "FileNotFoundError"
    assert "checkpoint missing" in err["detail"]
    assert not (tmp_path / "w.ready.json").exists()


def test_sigterm_calls_shutdown_and_exits_cleanly(tmp_path):
    marker = tmp_path / "shutdown.txt"
    f = _policy_file(tmp_path, f'''
        @seq.policy
        class P:
            @seq.load
            def load(self, weights_dir):
                self.weights_dir = weights_dir
            @seq.infer
            def infer(self, inputs):
                return {{"echo": inputs, "weights_dir": self.weights_dir}}
            @seq.shutdown
            def bye(self):
                open({str(marker)!r}, "w").write("bye")
        ''')
    w = WorkerProcess.start(f, tmp_path)
    r = w.act({"observation": {"state": [1.0]}})
    assert r.status_code == 200
    assert r.json()["action_chunk"] is None and r.json()["outputs"]["echo"] == {"state": [1.0]}
    assert r.json()["outputs"]["weights_dir"] == str(tmp_path / "w-weights")
    assert w.stop() == 0
    assert marker.read_text() == "bye"


# ---------------------------------------------------------------- the binary body, limits, OpenAPI

def _jpeg(width=64, height=64, color=(0, 0, 0)) -> bytes:
    import base64
    return base64.b64decode(png_b64(width, height, color, fmt="JPEG"))


def _binary(w: WorkerProcess, body: dict, raw: bytes = None) -> httpx.Response:
    """POST ``body`` (frames as raw ``"data"`` bytes) in the binary framing, or ``raw`` as it is."""
    content = raw if raw is not None else encode_act_body(body, binary=True)[0]
    return w.client.post("/act", content=content, headers={"Authorization": f"Bearer {w.secret}",
                                                           "Content-Type": BINARY_CONTENT_TYPE})


def _binary_echo_body(frame: bytes, **obs_kw) -> dict:
    obs = echo_observation(**obs_kw)
    obs["images"] = [{"view": "exterior_1", "data": frame, "timestamp_ms": 0}]
    return {"observation": obs, "params": {"chunk_len": 3}}


def test_binary_body_with_raw_jpeg_blobs_answers_like_json(echo):
    frame = _jpeg(color=(200, 10, 10))
    r = _binary(echo, _binary_echo_body(frame, joint_positions=[0, 1, 2, 3, 4, 5, 6], gripper=[0.25]))
    assert r.status_code == 200, r.text
    chunk = r.json()["action_chunk"]
    assert len(chunk["actions"]) == 3 and chunk["actions"][0][2:] == [2, 3, 4, 5, 6, 0.25]
    assert r.headers["content-type"].startswith("application/json")


def test_malformed_binary_framing_is_400_naming_the_problem(echo):
    frame = _jpeg()
    body = _error(_binary(echo, {}, raw=b"\x00\x00"), 400, "invalid_request")
    assert "4-byte JSON length" in body["detail"]
    body = _error(_binary(echo, {}, raw=b"\x00\x00\x10\x00{}"), 400, "invalid_request")
    assert "declares 4096 bytes of JSON but carries 2" in body["detail"]
    bad = _binary_echo_body(frame)
    bad["observation"]["images"][0] = {"view": "exterior_1", "blob": [10, len(frame)], "timestamp_ms": 0}
    head = json.dumps(bad).encode()
    body = _error(_binary(echo, {}, raw=len(head).to_bytes(4, "big") + head + frame), 400, "invalid_request")
    assert "is not an [offset, length] inside the" in body["detail"]
    body = _error(_binary(echo, _binary_echo_body(b"\xff\xd8" + b"\x00" * (len(frame) - 2))), 400, "invalid_request")
    assert "JPEG" in body["detail"]


def test_a_body_over_the_limit_is_413_before_it_is_parsed(echo):
    big = {"observation": echo_observation(), "params": {}, "padding": "x" * (ECHO_BODY_LIMIT + 10)}
    body = _error(echo.act(big), 413, "payload_too_large")
    assert body["details"]["limit_bytes"] == ECHO_BODY_LIMIT
    assert echo.act({"observation": echo_observation()}).status_code == 200


def test_openapi_is_served_and_documents_act_both_bodies(echo):
    doc = echo.client.get("/openapi.json").json()
    act = doc["paths"]["/act"]["post"]
    assert set(act["requestBody"]["content"]) == {"application/json", BINARY_CONTENT_TYPE}
    assert "observation" in act["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert {"200", "400", "401", "413", "500", "503", "504"} <= set(act["responses"])
    assert "/episode/end" in doc["paths"] and "/ping" in doc["paths"]


def test_the_curl_example_in_the_docs_works(echo):
    import re
    import subprocess
    from _servers import ROOT
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"```bash\n(curl [^`]*?/act[^`]*?)```", text)
    assert block, "docs/design.md has a ```bash curl ... /act``` example"
    env = {**os.environ, "WORKER_URL": echo.url, "DIRECT_SECRET": echo.secret, "FRAME_B64": png_b64(fmt="JPEG")}
    r = subprocess.run(["bash", "-c", block.group(1)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert len(body["action_chunk"]["actions"][0]) == 8 and body["action_chunk"]["robot"] == "panda"


# ---------------------------------------------------------------- the richer contract

@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    w = WorkerProcess.start(str(POLICIES / "contract_policy.py"), tmp_path_factory.mktemp("contract-worker"), name="contract")
    yield w
    w.stop()


def _depth_png_b64(width=32, height=24, mm=1500, bits=16) -> str:
    import base64
    import io
    import numpy as np
    from PIL import Image
    arr = np.full((height, width), mm, dtype=np.uint16 if bits == 16 else np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _contract_obs(front_reds=(10, 200), side_frames=2, depth=True, depth_bits=16) -> dict:
    images = [{"view": "front", "data": png_b64(32, 24, (r, 0, 0))} for r in front_reds]
    images += [{"view": "side", "data": png_b64(32, 24)} for _ in range(side_frames)]
    obs = {"images": images, "proprioception": {"joint_positions": [0.0, 0.0, 0.0]}, "instruction": "wave"}
    if depth:
        obs["depth"] = [{"view": "front", "data": _depth_png_b64(bits=depth_bits)}]
    return obs


def test_history_frames_reach_infer_oldest_first_with_depth_in_metres(contract):
    r = contract.act({"observation": _contract_obs()})
    assert r.status_code == 200, r.text
    n, oldest_red, depth_m, speed = r.json()["action_chunk"]["actions"][0]
    assert (n, oldest_red, depth_m, speed) == (2.0, 10.0, 1.5, 1.0)


def test_frames_beyond_the_declared_history_are_dropped_oldest_first(contract):
    r = contract.act({"observation": _contract_obs(front_reds=(1, 2, 30, 40))})
    assert r.status_code == 200, r.text
    n, oldest_red, _, _ = r.json()["action_chunk"]["actions"][0]
    assert (n, oldest_red) == (2.0, 30.0)


def test_too_few_frames_is_400_naming_the_view_and_history(contract):
    body = _error(contract.act({"observation": _contract_obs(side_frames=1)}), 400, "invalid_request")
    assert "view 'side' has 1 frame(s); this policy reads 2 per view (history=2)" in body["detail"]


def test_a_missing_or_8_bit_depth_frame_is_400(contract):
    body = _error(contract.act({"observation": _contract_obs(depth=False)}), 400, "invalid_request")
    assert "missing depth frame(s) for view(s) ['front']" in body["detail"]
    body = _error(contract.act({"observation": {**_contract_obs(), "depth": [{"view": "front", "data": _depth_png_b64(mm=150, bits=8)}]}}), 400, "invalid_request")
    assert "expected 16-bit grayscale millimetres" in body["detail"]


def test_range_and_one_of_params_are_refused_saying_what_is_allowed(contract):
    obs = _contract_obs()
    r = contract.act({"observation": obs, "params": {"speed": "1.5"}})
    assert r.status_code == 200 and r.json()["action_chunk"]["actions"][0][3] == 1.5
    body = _error(contract.act({"observation": obs, "params": {"speed": 3}}), 400, "invalid_request")
    assert "param 'speed'=3.0 is out of range (allowed: 0 to 2)" in body["detail"]
    assert body["details"]["reason"] == "params" and body["details"]["param"] == "speed"
    body = _error(contract.act({"observation": obs, "params": {"style": "reckless"}}), 400, "invalid_request")
    assert "allowed: one of ['fast', 'careful']" in body["detail"]


def test_a_chunk_of_the_wrong_action_space_is_refused(contract):
    body = _error(contract.act({"observation": _contract_obs(), "params": {"kind": "velocity"}}), 500, "policy_error")
    assert body["details"]["reason"] == "action_space"
    assert "joint_velocity; the contract declares joint_absolute" in body["detail"]


def test_max_delta_clips_each_step_with_a_warning_per_dimension(contract):
    body = contract.act({"observation": _contract_obs(), "params": {"kind": "jump"}}).json()
    assert body["action_chunk"]["actions"] == [[0.0] * 4, [0.5] * 4]
    assert [w.split(":")[0] for w in body["warnings"]] == [f"clipped step 1 dim {d}" for d in range(4)]


# ---------------------------------------------------------------- no contract, exceptions, caches, timeouts

@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    w = WorkerProcess.start(str(POLICIES / "raw_policy.py"), tmp_path_factory.mktemp("raw-worker"), name="raw")
    yield w
    w.stop()


def test_no_contract_policy_gets_the_dict_unchanged(raw):
    sent = {"op": "echo", "images": "not checked", "state": [1, 2], "nested": {"a": [None, True, "x"]}}
    r = raw.act({"observation": sent})
    assert r.status_code == 200, r.text
    assert r.json()["action_chunk"] is None and r.json()["outputs"]["echo"] == sent


def test_a_builtin_exception_comes_back_as_itself_with_the_traceback(raw):
    body = _error(raw.act({"observation": {"op": "keyerror"}}), 500, "policy_error")
    d = body["details"]
    assert d["exception_type"] == "KeyError" and d["builtin"] is True and d["exception_args"] == ["missing"]
    assert "raw_policy.py" in d["remote_traceback"] and 'inputs["missing"]' in d["remote_traceback"]


def test_a_policy_defined_exception_is_policy_error_with_its_name(raw):
    body = _error(raw.act({"observation": {"op": "custom"}}), 500, "policy_error")
    assert body["details"]["exception_type"] == "CalibrationDrift" and body["details"]["builtin"] is False
    assert "wrist camera moved" in body["detail"]


def test_compile_caches_point_at_the_deployments_cache_dir(raw):
    env = raw.act({"observation": {"op": "env"}}).json()["outputs"]
    cache = raw.ready_file.parent / "raw-weights-cache"
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
                   "JAX_COMPILATION_CACHE_DIR": str(cache / "jax")}
    assert all(os.path.isdir(p) for p in env.values())


def test_a_request_past_the_request_timeout_is_504_and_the_worker_finishes_it(raw):
    t0 = time.monotonic()
    # the slow request runs 1.6 s against a 1 s timeout: 504 at ~1 s, then it finishes; the next
    # request waits behind it for ~0.6 s (its wait counts toward its own 1 s) and is answered
    body = _error(raw.act({"observation": {"op": "sleep", "s": 1.6}}), 504, "request_timeout")
    assert 0.9 <= time.monotonic() - t0 < 1.55
    assert body["retryable"] is True and body["details"]["timeout_s"] == 1.0
    r = raw.act({"observation": {"op": "sleep", "s": 0.0}})          # queued behind the slow one
    assert r.status_code == 200 and time.monotonic() - t0 >= 1.55
    assert r.json()["outputs"]["calls"] >= 2


# ---------------------------------------------------------------- background load

def _phase(tmp_path, name: str, timeout: float = 20.0) -> dict:
    p = tmp_path / f"{name}.ready.json.phase"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            time.sleep(0.02)
    raise TimeoutError(p)


def test_while_loading_act_and_ping_answer_503_warming_with_retry_after_and_job_id(tmp_path):
    w = WorkerProcess.start(ECHO_POLICY, tmp_path, name="slow", env={"ECHO_LOAD_S": "2"}, wait=False)
    try:
        info = _phase(tmp_path, "slow")
        client = httpx.Client(base_url=f"http://127.0.0.1:{info['port']}", timeout=10)
        deadline = time.monotonic() + 10
        while True:
            try:
                r = client.post("/act", json={"observation": echo_observation()}, headers={"Authorization": f"Bearer {w.secret}"})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        body = _error(r, 503, "warming")
        assert body["retryable"] is True and int(r.headers["retry-after"]) >= 1
        assert body["details"]["job_id"] == info["job_id"] and body["details"]["phase"] in ("importing", "loading")
        assert client.get("/ping").status_code == 503
        deadline = time.monotonic() + 20
        while client.get("/ping").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        r = client.post("/act", json={"observation": echo_observation()}, headers={"Authorization": f"Bearer {w.secret}"})
        assert r.status_code == 200
        ready = tmp_path / "slow.ready.json"     # written just after /ping turns 200
        eventually(ready.exists, 10, what="the worker's ready file")
        assert json.loads(ready.read_text())["load_s"] >= 2.0
        client.close()
    finally:
        w.stop()


def test_a_load_past_the_startup_timeout_fails_the_worker_with_that_reason(tmp_path):
    f = _policy_file(tmp_path, '''
        @seq.policy(timeouts=seq.Timeouts(startup=1.0))
        class P:
            @seq.load
            def load(self, weights_dir):
                time.sleep(30)
            @seq.infer
            def infer(self, inputs):
                return {}
        ''')
    w = WorkerProcess.start(f, tmp_path, wait=False)
    assert w.proc.wait(timeout=20) == 3
    err = json.loads((tmp_path / "w.ready.json.error").read_text())
    assert err["phase"] == "loading" and err["exception_type"] == "TimeoutError"
    assert "did not load within the startup timeout (1 s)" in err["detail"]


# ---------------------------------------------------------------- episodes and replicas

def test_episodes_stick_to_a_replica_and_on_episode_runs_at_their_end(tmp_path):
    log_file = tmp_path / "episodes.log"
    w = WorkerProcess.start(str(POLICIES / "episode_policy.py"), tmp_path, name="ep",
                            env={"EPISODE_LOG": str(log_file), "SEQ_EPISODE_IDLE_S": "1.0"})
    try:
        def act(eid, **kw):
            r = w.act({"observation": {"episode": eid}, "episode_id": eid, **kw})
            assert r.status_code == 200, r.text
            return r.json()["outputs"]
        a = [act("a") for _ in range(3)]
        b = [act("b") for _ in range(3)]
        assert {o["replica"] for o in a} == {a[0]["replica"]} and {o["replica"] for o in b} == {b[0]["replica"]}
        assert a[0]["replica"] != b[0]["replica"] and a[0]["instance"] != b[0]["instance"]
        assert [o["steps"] for o in a] == [1, 2, 3]
        r = w.client.post("/episode/end", json={"episode_id": "a"}, headers={"Authorization": f"Bearer {w.secret}"})
        assert r.status_code == 200 and r.json() == {"episode_id": "a", "ended": True}
        assert log_file.read_text().splitlines() == [f"a {a[0]['replica']}"]
        assert act("c", end_episode=True)["steps"] == 1                 # the act runs, then the episode ends
        act("b")
        deadline = time.monotonic() + 10                                 # b idle for 1 s: ended by the worker
        while "b" not in [line.split()[0] for line in log_file.read_text().splitlines()]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert sorted(line.split()[0] for line in log_file.read_text().splitlines()) == ["a", "b", "c"]
    finally:
        w.stop()


def test_sigterm_ends_open_episodes_then_runs_shutdown(tmp_path):
    log_file = tmp_path / "episodes.log"
    w = WorkerProcess.start(str(POLICIES / "episode_policy.py"), tmp_path, name="ep", env={"EPISODE_LOG": str(log_file)})
    assert w.act({"observation": {"episode": "open"}, "episode_id": "open"}).status_code == 200
    assert w.stop() == 0
    assert [line.split()[0] for line in log_file.read_text().splitlines()] == ["open"]


# ---------------------------------------------------------------- batching

def _concurrent_acts(w: WorkerProcess, bodies: list, stagger_s: float = 0.0) -> list:
    out = [None] * len(bodies)

    def go(i):
        out[i] = w.act(bodies[i])
    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join()
    return out


def test_serving_batches_only_the_requests_that_waited_while_busy(tmp_path):
    w = WorkerProcess.start(str(POLICIES / "batch_policy.py"), tmp_path, name="bs")
    try:
        solo = w.act({"observation": {"instruction": "x"}, "params": {"tag": 7}}).json()
        assert solo["batch_size"] == 1 and solo["action_chunk"]["actions"] == [[7.0, 1.0, 0.0]]
        first = threading.Thread(target=w.act, args=({"observation": {"instruction": "x"}, "params": {"hold_ms": 600}},))
        first.start()
        time.sleep(0.3)                                                  # the replica is busy for ~0.3 s more
        rs = _concurrent_acts(w, [{"observation": {"instruction": "x"}, "params": {"tag": t}} for t in (1, 2, 3)])
        first.join()
        rows = sorted(r.json()["action_chunk"]["actions"][0] for r in rs)
        assert [row[0] for row in rows] == [1.0, 2.0, 3.0]                # each request got its own answer
        assert {row[1] for row in rows} == {3.0} and sorted(row[2] for row in rows) == [0.0, 1.0, 2.0]
    finally:
        w.stop()


def test_eval_batches_gather_until_quiet(tmp_path):
    w = WorkerProcess.start(str(POLICIES / "batch_policy.py"), tmp_path, name="be", env={"SEQ_WORKER_MODE": "eval"})
    try:
        rs = _concurrent_acts(w, [{"observation": {"instruction": "x"}, "params": {"tag": t}} for t in range(5)],
                              stagger_s=0.01)                            # 10 ms apart, inside the 50 ms quiet window
        assert all(r.status_code == 200 for r in rs)
        assert [r.json()["action_chunk"]["actions"][0][0] for r in rs] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert max(r.json()["batch_size"] for r in rs) >= 3
        assert w.client.get("/info").json()["mode"] == "eval"
    finally:
        w.stop()


def test_a_policy_raising_systemexit_or_keyboardinterrupt_is_policy_error_and_the_worker_serves_on(tmp_path):
    """sys.exit() or a KeyboardInterrupt out of infer is the policy's error like any other: it
    used to end the replica's thread silently (every later request 504, /ping still ready)."""
    f = _policy_file(tmp_path, '''
        import sys
        @seq.policy(action=seq.ActionContract("arm", "joint_absolute", 1, 10.0), timeouts=seq.Timeouts(request=5.0))
        class P:
            @seq.load
            def load(self, weights_dir): pass
            @seq.infer
            def infer(self, obs, *, how: str = "") -> seq.ActionChunk:
                if how == "exit":
                    sys.exit(3)
                if how == "interrupt":
                    raise KeyboardInterrupt
                return seq.ActionChunk([[1.0]])
        ''')
    w = WorkerProcess.start(f, tmp_path)
    try:
        obs = {"instruction": "x"}
        for how, kind in (("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")):
            body = _error(w.act({"observation": obs, "params": {"how": how}}), 500, "policy_error")
            assert body["details"]["exception_type"] == kind
            r = w.act({"observation": obs})
            assert r.status_code == 200 and r.json()["action_chunk"]["actions"] == [[1.0]], r.text
        assert w.client.get("/ping").json()["status"] == "ready" and w.proc.poll() is None
    finally:
        w.stop()
